"""`quorumlog topic|produce|consume` against the in-process fake stream cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from quorumlog.cli.main import cli
from quorumlog.cli.stream_commands import describe_lines
from quorumlog.stream.records import PartitionDescription, TopicDescription
from tests.unit.kv.fake_cluster import ClusterThread
from tests.unit.stream.fake_stream_cluster import FakeStreamCluster


@pytest.fixture
def common() -> Iterator[list[str]]:
    with ClusterThread(FakeStreamCluster()) as cluster:
        yield ["--endpoints", ",".join(cluster.endpoints)]


def invoke(arguments: list[str], input_text: str | None = None) -> str:
    result = CliRunner().invoke(cli, arguments, input=input_text)
    assert result.exit_code == 0, result.output
    return result.output


def test_topic_produce_consume_round_trip(common: list[str]) -> None:
    invoke(["topic", "create", "lines", "--partitions", "2", *common])
    assert invoke(["topic", "list", *common]).splitlines() == ["lines"]
    invoke(["produce", "lines", "--partition", "1", *common], "first\nsecond\n")
    invoke(["produce", "lines", "--key-separator", "=", "--partition", "0", *common], "k=v=w\n")
    printed = invoke(
        [
            "consume",
            "lines",
            "--from-beginning",
            "--max-messages",
            "3",
            "--timeout-ms",
            "200",
            "--print-partition",
            "--print-offset",
            "--print-key",
            *common,
        ]
    )
    assert sorted(printed.splitlines()) == [
        "Partition:0\tOffset:0\tk\tv=w",
        "Partition:1\tOffset:0\tnull\tfirst",
        "Partition:1\tOffset:1\tnull\tsecond",
    ]
    # Without --from-beginning a consumer starts at the end: nothing old is printed.
    assert invoke(["consume", "lines", "--timeout-ms", "50", *common]) == ""
    described = invoke(["topic", "describe", *common])
    assert "Topic: lines\tPartitionCount: 2" in described
    assert "Partition: 1\tLeader: n2" in described
    assert "EndOffset: 2" in described


def test_consume_with_group_commits_its_offsets(common: list[str]) -> None:
    invoke(["topic", "create", "lines", *common])
    invoke(["produce", "lines", *common], "a\nb\nc\n")
    group = ["--group", "g", "--from-beginning", "--timeout-ms", "50"]
    assert invoke(["consume", "lines", "--max-messages", "2", *group, *common]) == "a\nb\n"
    assert invoke(["consume", "lines", *group, *common]) == "c\n"


def test_consume_takes_a_max_poll_interval(common: list[str]) -> None:
    invoke(["topic", "create", "lines", *common])
    invoke(["produce", "lines", *common], "a\n")
    group = ["--group", "g", "--from-beginning", "--timeout-ms", "50"]
    interval = ["--max-poll-interval-ms", "60000"]
    assert invoke(["consume", "lines", *interval, *group, *common]) == "a\n"
    refused = CliRunner().invoke(cli, ["consume", "lines", "--max-poll-interval-ms", "0"])
    assert refused.exit_code == 2 and "--max-poll-interval-ms" in refused.output


def test_produce_refuses_a_line_without_the_key_separator(common: list[str]) -> None:
    invoke(["topic", "create", "lines", *common])
    result = CliRunner().invoke(
        cli, ["produce", "lines", "--key-separator", ":", *common], input="k:v\nno key\n"
    )
    assert result.exit_code == 1
    assert "line 2 has no key separator" in result.output


def test_describe_lines_show_unknown_offsets_and_errors() -> None:
    description = TopicDescription(
        "t",
        1,
        3,
        -1,
        -1,
        [PartitionDescription(0, None, ["n1", "n2"], [], None, None, error="unavailable")],
    )
    lines = list(describe_lines(description))
    assert lines[1] == (
        "\tTopic: t\tPartition: 0\tLeader: none\tReplicas: n1,n2\tIsr: \t"
        "BeginOffset: unknown\tEndOffset: unknown\tError: unavailable"
    )
