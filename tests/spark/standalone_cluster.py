"""A Spark standalone cluster on loopback for tests: one master and N workers, each its
own JVM, started from the launcher the pyspark wheel ships.

The wheel ships `bin/spark-class` but not `sbin/start-master.sh` / `start-worker.sh`
(those come with the full Spark distribution; they only call `spark-daemon.sh`, which
calls `spark-class` with the Master or Worker class). So the daemons are started here
the way those scripts start them, in the foreground, as children of the test: their ids
are known, the kernel kills them if the test dies, and their logs stay in the directory.
Every port is chosen by the daemon itself (port 0) and read back from its log.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import pyspark

from tests.integration.process_cluster import _die_with_parent, wait_until

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
MASTER_URL = re.compile(r"Starting Spark master at (spark://[\w.\-]+:\d+)")
REGISTERED = "Successfully registered with master"
STOP_SECONDS = 20.0
DAEMON_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Short-lived daemons on a small machine: the quick JIT tier only, one GC thread."""


class CannotStart(Exception):
    """The cluster cannot run here (no Java, no launcher, a daemon exited at once)."""


def spark_home() -> Path:
    return Path(pyspark.__file__).parent


def check_can_start() -> None:
    launcher = spark_home() / "bin" / "spark-class"
    if not launcher.exists():
        raise CannotStart(f"the pyspark package has no {launcher}")
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and Path(java_home, "bin", "java").exists()):
        raise CannotStart("no Java (Spark needs Java 17): neither java on PATH nor JAVA_HOME")


class SparkStandalone:
    """`with SparkStandalone(directory, workers=2) as cluster:` … `cluster.master_url`."""

    def __init__(self, directory: Path, workers: int = 2, start_seconds: float = 180.0) -> None:
        self.directory = directory
        self.worker_count = workers
        self.start_seconds = start_seconds
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.master_url = ""

    def __enter__(self) -> SparkStandalone:
        check_can_start()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        environment = dict(os.environ)
        environment.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=str(self.directory / "logs"),
            SPARK_DAEMON_JAVA_OPTS=DAEMON_JAVA_OPTIONS,
            SPARK_DAEMON_MEMORY="256m",
            # Executors start Python workers with this interpreter (it has quorumlog).
            PYSPARK_PYTHON=sys.executable,
        )
        return environment

    def launch(self, name: str, arguments: list[str]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.log_path(name), "wb") as log_file:  # a fresh log: its URL is read
            self.processes[name] = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *arguments],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=self.environment(),
                preexec_fn=_die_with_parent,
            )

    def log_path(self, name: str) -> Path:
        return self.directory / f"{name}.log"

    def log_text(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def check_running(self, name: str) -> None:
        code = self.processes[name].poll()
        if code is not None:
            tail = "\n".join(self.log_text(name).splitlines()[-15:])
            raise CannotStart(f"the Spark {name} exited with {code}:\n{tail}")

    def start(self) -> None:
        self.launch(
            "master", [MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
        )

        def master_url() -> str | None:
            self.check_running("master")
            found = MASTER_URL.search(self.log_text("master"))
            return found.group(1) if found else None

        self.master_url = wait_until(master_url, self.start_seconds, "the Spark master", 0.2)
        for number in range(1, self.worker_count + 1):
            work = self.directory / f"worker-{number}"
            work.mkdir(parents=True, exist_ok=True)
            self.launch(
                f"worker-{number}",
                [
                    WORKER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--webui-port",
                    "0",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work),
                    self.master_url,
                ],
            )
        for number in range(1, self.worker_count + 1):
            name = f"worker-{number}"

            def registered(name: str = name) -> bool:
                self.check_running(name)
                return REGISTERED in self.log_text(name)

            wait_until(registered, self.start_seconds, f"Spark {name} to register", 0.2)

    def stop(self) -> None:
        """Workers first (each stops its executors on SIGTERM), then the master."""
        names = sorted(name for name in self.processes if name != "master")
        for group in (names, ["master"]):
            running = [self.processes[name] for name in group if name in self.processes]
            for process in running:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_SECONDS
            for process in running:
                try:
                    process.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()
