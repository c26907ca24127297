"""`quorumlog dev up | status | down` through the command line, in a temporary directory."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog.cli.defaults import DEV_STATE_FILE
from quorumlog.cli.node_commands import process_alive

from .process_cluster import query_status, wait_until

COMMAND_TIMEOUT_SECONDS = 30.0
CLUSTER_ID = "dev-cli-test"


def quorumlog(*arguments: str, endpoints: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "QUORUMLOG_CLUSTER_ID": CLUSTER_ID}
    if endpoints is not None:
        environment["QUORUMLOG_ENDPOINTS"] = endpoints
    return subprocess.run(
        [sys.executable, "-m", "quorumlog", *arguments],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        env=environment,
        check=False,
    )


def recorded_pids(directory: Path) -> list[int]:
    state_path = directory / DEV_STATE_FILE
    if not state_path.exists():
        return []
    state = json.loads(state_path.read_text())
    return [int(pid) for pid in state["pids"].values()]


@pytest.fixture
def dev_directory(tmp_path: Path) -> Iterator[Path]:
    """The --dir of the dev cluster; whatever the test did, no node outlives it."""
    directory = tmp_path / "dev"
    yield directory
    pids = recorded_pids(directory)
    if pids:
        quorumlog("dev", "down", "--dir", str(directory))
    for pid in pids:
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)  # not our child (dev up's was): no reaping here


def test_dev_up_status_down(dev_directory: Path) -> None:
    started = quorumlog("dev", "up", "--nodes", "3", "--dir", str(dev_directory))
    assert started.returncode == 0, started.stderr
    assert "started 3 nodes" in started.stdout
    exported = [line for line in started.stdout.splitlines() if "QUORUMLOG_ENDPOINTS=" in line]
    endpoints = exported[0].split("=", 1)[1]
    assert len(endpoints.split(",")) == 3
    pids = recorded_pids(dev_directory)
    assert len(pids) == 3
    dashboards = re.findall(r"^n\d dashboard: (http://\S+)", started.stdout, re.MULTILINE)
    assert len(dashboards) == 3, started.stdout
    for url in dashboards:
        with urllib.request.urlopen(url, timeout=10) as page:
            assert b"quorumlog node" in page.read()

    status = quorumlog("dev", "status", "--dir", str(dev_directory))
    assert status.returncode == 0, status.stderr
    assert status.stdout.count(" up") == 3, status.stdout

    def one_leader() -> bool:
        answers = [query_status(endpoint, CLUSTER_ID) for endpoint in endpoints.split(",")]
        return all(answers) and sum(1 for a in answers if a and a.is_leader) == 1

    wait_until(one_leader, COMMAND_TIMEOUT_SECONDS, "the dev cluster to elect a leader")
    put = quorumlog("kv", "put", "greeting", "hello", endpoints=endpoints)
    assert put.returncode == 0, put.stderr
    get = quorumlog("kv", "get", "greeting", endpoints=endpoints)
    assert get.returncode == 0, get.stderr
    assert get.stdout.strip() == "hello"
    cluster_status = quorumlog("status", "-w", "json", endpoints=endpoints)
    assert cluster_status.returncode == 0, cluster_status.stderr

    stopped = quorumlog("dev", "down", "--dir", str(dev_directory))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped n1, n2, n3" in stopped.stdout
    wait_until(
        lambda: not any(process_alive(pid) for pid in pids),
        COMMAND_TIMEOUT_SECONDS,
        "every dev node process to exit",
    )
    after = quorumlog("dev", "status", "--dir", str(dev_directory))
    assert "no dev cluster running" in after.stdout
    for node_id in ("n1", "n2", "n3"):
        assert (dev_directory / f"{node_id}.log").exists()
        assert (dev_directory / node_id / "kv" / "log").is_dir()  # data stays


def test_dev_up_with_shard_groups_then_shard_commands(dev_directory: Path) -> None:
    started = quorumlog("dev", "up", "--groups", "2", "--dir", str(dev_directory))
    assert started.returncode == 0, started.stderr
    assert "joined shard groups 1..2: configuration 1" in started.stdout
    state = json.loads((dev_directory / DEV_STATE_FILE).read_text())
    endpoints = state["endpoints"]
    assert sorted(state["groups"]) == ["1", "2"]
    # By node id, not address: an id follows its node when it restarts on a new port.
    assert all(servers == ["n1", "n2", "n3"] for servers in state["groups"].values())
    status = quorumlog("dev", "status", "--dir", str(dev_directory))
    assert "shard group 1" in status.stdout and "shard group 2" in status.stdout

    query = quorumlog("shard", "query", "-w", "json", endpoints=endpoints)
    assert query.returncode == 0, query.stderr
    configuration = json.loads(query.stdout)
    assert configuration["number"] == 1
    assert sorted(set(configuration["shards"])) == [1, 2]

    def every_shard_serving() -> dict[str, Any] | None:
        shard_status = quorumlog("shard", "status", "-w", "json", endpoints=endpoints)
        if shard_status.returncode != 0:
            return None
        report: dict[str, Any] = json.loads(shard_status.stdout)
        rows = report["shards"]
        serving = all(row["state"] == "serving" and row["leader"] for row in rows)
        return report if serving else None

    report = wait_until(every_shard_serving, COMMAND_TIMEOUT_SECONDS, "every shard to serve")
    assert [row["shard"] for row in report["shards"]] == list(range(16))
    assert [row["gid"] for row in report["shards"]] == configuration["shards"]
    assert {row["leader"] for row in report["shards"]} <= set(endpoints.split(","))

    put = quorumlog("shard", "put", "colour", "blue", endpoints=endpoints)
    assert put.returncode == 0, put.stderr
    get = quorumlog("shard", "get", "colour", endpoints=endpoints)
    assert get.stdout.strip() == "blue", get.stderr
    refused = quorumlog("shard", "move", "0", "9", endpoints=endpoints)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "group 9" in refused.stderr

    stopped = quorumlog("dev", "down", "--dir", str(dev_directory))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped n1, n2, n3" in stopped.stdout


def in_dev_directory(directory: Path, *arguments: str, stdin: str | None = None) -> str:
    """Run `quorumlog ARGUMENTS` as a user in the dev cluster's directory would: no
    --endpoints, the dev state file names them. Returns stdout; fails the test on an error."""
    environment = {**os.environ, "QUORUMLOG_CLUSTER_ID": CLUSTER_ID}
    environment.pop("QUORUMLOG_ENDPOINTS", None)
    environment["QUORUMLOG_DEV_DIR"] = str(directory)
    finished = subprocess.run(
        [sys.executable, "-m", "quorumlog", *arguments],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=COMMAND_TIMEOUT_SECONDS * 2,
        env=environment,
        check=False,
    )
    assert finished.returncode == 0, f"quorumlog {' '.join(arguments)}: {finished.stderr}"
    return finished.stdout


def test_dev_down_then_up_on_new_ports_keeps_every_client_working(dev_directory: Path) -> None:
    """A node restarted on new addresses keeps its cluster usable: `dev up` after `dev down`
    binds new ports, while the logs still hold the old addresses (in topic descriptors and
    anything else stored); KV, sharded KV and topics must all be reached at the new ones."""
    timeout = ("--timeout", "20")
    first = in_dev_directory(
        dev_directory, "dev", "up", "--groups", "2", "--dir", str(dev_directory)
    )
    old_endpoints = json.loads((dev_directory / DEV_STATE_FILE).read_text())["endpoints"]
    assert "joined shard groups 1..2" in first
    in_dev_directory(dev_directory, "kv", "put", "greeting", "hello", *timeout)
    in_dev_directory(dev_directory, "shard", "put", "colour", "blue", *timeout)
    in_dev_directory(dev_directory, "topic", "create", "events", "--partitions", "2", *timeout)
    in_dev_directory(dev_directory, "produce", "events", *timeout, stdin="one\ntwo\n")
    in_dev_directory(dev_directory, "dev", "down", "--dir", str(dev_directory))

    second = in_dev_directory(
        dev_directory, "dev", "up", "--groups", "2", "--dir", str(dev_directory)
    )
    new_endpoints = json.loads((dev_directory / DEV_STATE_FILE).read_text())["endpoints"]
    assert set(new_endpoints.split(",")).isdisjoint(old_endpoints.split(",")), second
    assert in_dev_directory(dev_directory, "kv", "get", "greeting", *timeout).strip() == "hello"
    in_dev_directory(dev_directory, "kv", "put", "greeting", "again", *timeout)
    assert in_dev_directory(dev_directory, "kv", "get", "greeting", *timeout).strip() == "again"
    assert in_dev_directory(dev_directory, "shard", "get", "colour", *timeout).strip() == "blue"
    in_dev_directory(dev_directory, "shard", "put", "colour", "green", *timeout)
    assert in_dev_directory(dev_directory, "shard", "get", "colour", *timeout).strip() == "green"
    in_dev_directory(dev_directory, "produce", "events", *timeout, stdin="three\n")
    consumed = in_dev_directory(
        dev_directory,
        "consume",
        "events",
        "--from-beginning",
        "--max-messages",
        "3",
        "--timeout-ms",
        "10000",
        *timeout,
    )
    assert sorted(consumed.split()) == ["one", "three", "two"]
    in_dev_directory(dev_directory, "dev", "down", "--dir", str(dev_directory))


def test_dev_up_with_bookies_lists_node_and_bookie_only_processes(dev_directory: Path) -> None:
    started = quorumlog("dev", "up", "--nodes", "1", "--bookies", "1", "--dir", str(dev_directory))
    assert started.returncode == 0, started.stderr
    assert "started 1 nodes and 1 bookies" in started.stdout
    state = json.loads((dev_directory / DEV_STATE_FILE).read_text())
    assert sorted(state["pids"]) == ["bookie-1", "n1"]
    assert state["endpoints"] == state["addresses"]["n1"]  # a bookie is no metadata endpoint

    def both_writable() -> dict[str, Any] | None:
        shown = quorumlog("bookie", "list", "-w", "json", endpoints=state["endpoints"])
        if shown.returncode != 0:
            return None
        rows = {row["id"]: row for row in json.loads(shown.stdout)}
        writable = all(rows.get(name, {}).get("writable") for name in ("n1", "bookie-1"))
        return rows if writable else None

    rows = wait_until(both_writable, COMMAND_TIMEOUT_SECONDS, "n1 and bookie-1 to register")
    assert rows["bookie-1"]["address"] == state["bookies"]["bookie-1"]
    assert rows["n1"]["address"] == state["addresses"]["n1"]
    status = quorumlog("dev", "status", "--dir", str(dev_directory))
    assert "bookie-1" in status.stdout and status.stdout.count(" up") == 2, status.stdout

    pids = recorded_pids(dev_directory)
    stopped = quorumlog("dev", "down", "--dir", str(dev_directory))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped n1, bookie-1" in stopped.stdout
    wait_until(
        lambda: not any(process_alive(pid) for pid in pids),
        COMMAND_TIMEOUT_SECONDS,
        "the node and the bookie process to exit",
    )
    assert (dev_directory / "bookie-1").is_dir()  # data stays
