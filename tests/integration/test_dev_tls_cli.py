"""`quorumlog dev up --tls` end to end: the printed exports point the command at the
certificates, and without them the command is refused with a clear message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.cli.defaults import DEV_STATE_FILE
from quorumlog.cli.node_commands import process_alive

COMMAND_TIMEOUT_SECONDS = 60.0
CLUSTER_ID = "dev-tls-test"
TLS_VARIABLES = ("QUORUMLOG_CACERT", "QUORUMLOG_CERT", "QUORUMLOG_KEY")


def quorumlog(*arguments: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", *arguments],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        env=environment,
        check=False,
    )


def base_environment() -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in TLS_VARIABLES}
    return {**environment, "QUORUMLOG_CLUSTER_ID": CLUSTER_ID}


@pytest.fixture
def dev_directory(tmp_path: Path) -> Iterator[Path]:
    """The --dir of the dev cluster; whatever the test did, no node outlives it."""
    directory = tmp_path / "dev"
    yield directory
    state_path = directory / DEV_STATE_FILE
    if not state_path.exists():
        return
    pids = [int(pid) for pid in json.loads(state_path.read_text())["pids"].values()]
    quorumlog("dev", "down", "--dir", str(directory), environment=base_environment())
    for pid in pids:
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)  # not our child (dev up's was): no reaping here


def exports(output: str) -> dict[str, str]:
    pairs = [line.removeprefix("export ").split("=", 1) for line in output.splitlines()]
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2 and pair[0].isupper()}


def test_dev_up_tls_works_with_the_printed_exports_and_refuses_plaintext(
    dev_directory: Path,
) -> None:
    environment = base_environment()
    started = quorumlog(
        "dev", "up", "--tls", "--nodes", "1", "--dir", str(dev_directory), environment=environment
    )
    assert started.returncode == 0, started.stderr
    printed = exports(started.stdout)
    assert set(printed) == {"QUORUMLOG_ENDPOINTS", *TLS_VARIABLES}, started.stdout
    assert all(Path(printed[name]).is_file() for name in TLS_VARIABLES)

    secured = {**environment, **printed}
    put = quorumlog("kv", "put", "greeting", "hello", environment=secured)
    assert put.returncode == 0, put.stderr
    got = quorumlog("kv", "get", "greeting", environment=secured)
    assert (got.returncode, got.stdout.strip()) == (0, "hello"), got.stderr

    plaintext = {**environment, "QUORUMLOG_ENDPOINTS": printed["QUORUMLOG_ENDPOINTS"]}
    refused = quorumlog("kv", "get", "greeting", "--timeout", "30", environment=plaintext)
    assert refused.returncode == 1
    assert "speaks TLS and this client does not" in refused.stderr
    assert "QUORUMLOG_CACERT" in refused.stderr

    no_certificate = {**plaintext, "QUORUMLOG_CACERT": printed["QUORUMLOG_CACERT"]}
    refused = quorumlog("kv", "get", "greeting", environment=no_certificate)
    assert refused.returncode == 1
    assert "did not accept this client's certificate" in refused.stderr
    node_log = (dev_directory / "n1.log").read_text()
    assert "it does not speak TLS" in node_log
    assert "no certificate was presented" in node_log
