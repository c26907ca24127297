"""`quorumlog group list|describe|reset-offsets|delete` and `consume --group/--offset`
against the in-process fake stream cluster (which runs the real coordinator machine)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from quorumlog import Consumer
from quorumlog.cli.main import cli
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster


@pytest.fixture
def cluster() -> Iterator[FakeStreamCluster]:
    with ClusterThread(FakeStreamCluster()) as running:
        yield running  # type: ignore[misc]


def invoke(arguments: list[str], input_text: str | None = None, exit_code: int = 0) -> str:
    result = CliRunner().invoke(cli, arguments, input=input_text)
    assert result.exit_code == exit_code, result.output
    # A cluster's refusal leaves the command as its typed error (`main` prints it).
    return result.output + (str(result.exception) if exit_code == 1 else "")


def test_group_commands_describe_lag_reset_and_delete(cluster: FakeStreamCluster) -> None:
    common = ["--endpoints", ",".join(cluster.endpoints)]
    invoke(["topic", "create", "lines", "--partitions", "2", *common])
    invoke(["produce", "lines", "--partition", "0", *common], "a\nb\nc\n")
    invoke(["produce", "lines", "--partition", "1", *common], "d\n")
    consume = ["consume", "lines", "--group", "g", "--offset", "earliest", "--timeout-ms", "100"]
    assert sorted(invoke([*consume, "--max-messages", "3", *common]).split()) in (
        ["a", "b", "c"],
        ["a", "b", "d"],
    )
    assert json.loads(invoke(["group", "list", "-w", "json", *common])) == [
        {"group": "g", "state": "Empty", "members": 0, "generation": 2}
    ]
    described = json.loads(invoke(["group", "describe", "g", "-w", "json", *common]))
    lags = {row["partition"]: row["lag"] for row in described["partitions"]}
    assert sum(lags.values()) == 1 and described["state"] == "Empty"
    table = invoke(["group", "describe", "g", *common])
    assert "LOG-END-OFFSET" in table.splitlines()[1]
    reset = ["group", "reset-offsets", "g", "--topic", "lines", *common]
    assert invoke([*reset, "--to-offset", "1"]).splitlines() == ["g\tlines\t0\t1", "g\tlines\t1\t1"]
    assert invoke([*consume, *common]).split() == ["b", "c"]
    with Consumer(cluster.endpoints, group="g") as member:
        member.subscribe(["lines"])
        refused = invoke([*reset, "--to-earliest"], exit_code=1)
        assert "live members" in refused
        assert "live members" in invoke(["group", "delete", "g", *common], exit_code=1)
        listed = json.loads(invoke(["group", "list", "-w", "json", *common]))
        assert listed[0]["state"] == "Stable" and listed[0]["members"] == 1
    invoke([*reset, "--to-latest"])
    assert invoke(["group", "delete", "g", *common]) == "deleted group g\n"
    assert "no consumer group" in invoke(["group", "describe", "g", *common], exit_code=1)


def test_consume_offset_needs_partition_for_a_number(cluster: FakeStreamCluster) -> None:
    common = ["--endpoints", ",".join(cluster.endpoints)]
    invoke(["topic", "create", "lines", *common])
    invoke(["produce", "lines", *common], "a\nb\n")
    assert "needs --partition" in invoke(
        ["consume", "lines", "--offset", "1", *common], exit_code=2
    )
    latest = ["consume", "lines", "--offset", "latest", "--timeout-ms", "50", *common]
    assert invoke(latest) == ""
    at_one = ["consume", "lines", "--partition", "0", "--offset", "1", "--timeout-ms", "50"]
    assert invoke([*at_one, *common]) == "b\n"
