"""`quorumlog kv|status|member|leader` against the fake cluster."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli, main
from tests.unit.kv.fake_cluster import ClusterThread, FakeCluster


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with ClusterThread(FakeCluster()) as running:
        yield running


def invoke(cluster: FakeCluster, *arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, list(arguments), env={"QUORUMLOG_ENDPOINTS": ",".join(cluster.endpoints)}
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def run_main(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the real entry point (which turns QuorumLogError into one line)."""
    old_argv = sys.argv
    sys.argv = ["quorumlog", *arguments]
    try:
        with pytest.raises(SystemExit) as exit_info:
            main()
    finally:
        sys.argv = old_argv
    captured = capsys.readouterr()
    code = exit_info.value.code
    return code if isinstance(code, int) else 1, captured.out, captured.err


def test_kv_commands(cluster: FakeCluster) -> None:
    assert invoke(cluster, "kv", "put", "k", "hello") == (0, "OK\n")
    assert invoke(cluster, "kv", "append", "k", " world") == (0, "OK\n")
    assert invoke(cluster, "kv", "get", "k") == (0, "hello world\n")
    assert invoke(cluster, "kv", "get", "k", "--stale") == (0, "hello world\n")
    assert invoke(cluster, "kv", "del", "k") == (0, "1\n")
    assert invoke(cluster, "kv", "del", "k") == (0, "0\n")
    assert invoke(cluster, "kv", "get", "k") == (0, "")


def test_endpoints_option_beats_environment(cluster: FakeCluster) -> None:
    result = CliRunner().invoke(
        cli,
        ["kv", "put", "k", "v", "--endpoints", cluster.node("n2").address],
        env={"QUORUMLOG_ENDPOINTS": "127.0.0.1:1"},
    )
    assert (result.exit_code, result.output) == (0, "OK\n")


def test_status_table_and_json(cluster: FakeCluster) -> None:
    code, output = invoke(cluster, "status")
    assert code == 0
    assert "IS LEADER" in output and "APPLIED INDEX" in output
    assert "n1" in output and "true" in output
    code, output = invoke(cluster, "status", "-w", "json")
    assert code == 0
    rows = json.loads(output)
    assert [row["node_id"] for row in rows] == ["n1", "n2", "n3"]
    assert [row["is_leader"] for row in rows] == [True, False, False]
    assert {"endpoint", "term", "commit_index", "applied_index", "last_index", "errors"} <= set(
        rows[0]
    )


def test_status_unreachable_endpoint_is_a_row(
    cluster: FakeCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    endpoints = f"{cluster.node('n1').address},{dead}"
    code, out, err = run_main(["status", "-w", "json", "--endpoints", endpoints], capsys)
    assert code == 1
    rows = json.loads(out)
    assert rows[0]["node_id"] == "n1"
    assert rows[1]["endpoint"] == dead
    assert "Connection" in rows[1]["errors"][0] or "refused" in rows[1]["errors"][0]
    assert err == "error: 1 of 2 endpoints did not answer\n"


def test_member_and_leader_commands(cluster: FakeCluster) -> None:
    code, output = invoke(cluster, "member", "list", "-w", "json")
    assert code == 0
    assert [member["node_id"] for member in json.loads(output)] == ["n1", "n2", "n3"]
    code, output = invoke(cluster, "member", "list")
    assert code == 0 and "voter" in output
    assert invoke(cluster, "member", "add", "n4", "127.0.0.1:9", "--learner")[0] == 0
    assert invoke(cluster, "member", "promote", "n4")[0] == 0
    assert invoke(cluster, "member", "remove", "n4")[0] == 0
    assert [change.kind for change in cluster.member_changes] == [
        "add_learner",
        "promote_learner",
        "remove",
    ]
    assert invoke(cluster, "leader", "transfer", "n3") == (0, "leader is n3\n")
    assert cluster.leader_id == "n3"


def test_errors_are_one_line(cluster: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    endpoints = ",".join(cluster.endpoints)
    code, out, err = run_main(["leader", "transfer", "n9", "--endpoints", endpoints], capsys)
    assert (code, out) == (1, "")
    assert err == "error: not_found: no node n9\n"
    code, out, err = run_main(
        ["kv", "put", "k", "v", "--endpoints", endpoints, "--cluster-id", "other"], capsys
    )
    assert code == 1
    assert err.count("\n") == 1 and "refused" in err and "Traceback" not in err


def test_bad_endpoints_are_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["kv", "get", "k", "--endpoints", "nonsense"])
    assert result.exit_code == 2
    assert "not host:port" in result.output
