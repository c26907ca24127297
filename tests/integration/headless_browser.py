"""A headless Chromium driven over the DevTools protocol (CDP), for the dashboard's test.

    with HeadlessBrowser.launch(tmp_path) as browser:
        page = browser.open("http://127.0.0.1:8080/")
        page.evaluate("document.title")

One page instance stays open, so a test sees the same page re-render (not a fresh load).
The browser is Debian's `chromium` (or `chromium-browser`, `google-chrome`); `find_chromium`
returns None when there is none, and the test skips saying so. It listens on a port the OS
picks (`--remote-debugging-port=0`) and says which on stderr.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from websockets.sync.client import ClientConnection, connect

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LAUNCH_TIMEOUT_SECONDS = 30.0
COMMAND_TIMEOUT_SECONDS = 15.0
DEVTOOLS_LINE = re.compile(r"DevTools listening on (ws://\S+)")


def find_chromium() -> str | None:
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


class HeadlessBrowser:
    def __init__(self, process: subprocess.Popen[str], socket: ClientConnection) -> None:
        self.process = process
        self.socket = socket
        self.ids = itertools.count(1)

    @classmethod
    def launch(cls, profile_directory: Path) -> HeadlessBrowser:
        binary = find_chromium()
        if binary is None:
            raise FileNotFoundError("no chromium binary on PATH")
        process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # root in a container has no user namespace for the sandbox
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile_directory}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            url = cls.devtools_url(process)
            socket = connect(url, open_timeout=LAUNCH_TIMEOUT_SECONDS, max_size=None)
        except BaseException:
            process.kill()
            process.wait()
            raise
        return cls(process, socket)

    @staticmethod
    def devtools_url(process: subprocess.Popen[str]) -> str:
        """The browser's websocket address, read from its stderr (it says it at start)."""
        if process.stderr is None:
            raise AssertionError("chromium's stderr is not piped")
        deadline = time.monotonic() + LAUNCH_TIMEOUT_SECONDS
        seen: list[str] = []
        # readline blocks until a line comes or the process ends; chromium prints the
        # line within a second or two, and an exit ends the loop with its output.
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            seen.append(line)
            found = DEVTOOLS_LINE.search(line)
            if found:
                return found.group(1)
        raise AssertionError("chromium did not start:\n" + "".join(seen[-20:]))

    def __enter__(self) -> HeadlessBrowser:
        return self

    def __exit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.socket.close()
        self.process.kill()
        self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()

    def command(self, method: str, session: str | None = None, **params: Any) -> Any:
        """Send one CDP command and return its result (events in between are skipped)."""
        message_id = next(self.ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self.socket.send(json.dumps(message))
        deadline = time.monotonic() + COMMAND_TIMEOUT_SECONDS
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"chromium did not answer {method}")
            answer = json.loads(self.socket.recv(timeout=remaining))
            if answer.get("id") != message_id:
                continue
            if "error" in answer:
                raise AssertionError(f"{method} failed: {answer['error']}")
            return answer.get("result", {})

    def open(self, url: str) -> Page:
        target = self.command("Target.createTarget", url=url)["targetId"]
        session = self.command("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        return Page(self, session)


class Page:
    """One open page (a CDP session attached to its target)."""

    def __init__(self, browser: HeadlessBrowser, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        result = self.browser.command(
            "Runtime.evaluate",
            session=self.session,
            expression=expression,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")
