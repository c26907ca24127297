"""`quorumlog shard` argument parsing and `dev up --groups` node flags, without a cluster."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from quorumlog.cli.node_commands import free_ports, parse_shard_groups, sharded_kv_arguments
from quorumlog.cli.shard_commands import parse_groups

QUORUMLOG = [sys.executable, "-m", "quorumlog"]


def test_groups_parse_as_gid_and_servers() -> None:
    assert parse_groups(("1=127.0.0.1:1,127.0.0.1:2", "2=h:3")) == {
        1: ["127.0.0.1:1", "127.0.0.1:2"],
        2: ["h:3"],
    }


def test_servers_may_be_node_ids_which_follow_their_nodes_to_new_addresses() -> None:
    assert parse_groups(("1=n1,n2,n3", "2=n4,h:5")) == {1: ["n1", "n2", "n3"], 2: ["n4", "h:5"]}


@pytest.mark.parametrize("text", ["1", "x=h:1", "0=h:1", "1=", "1=h:", "1=h:port", "-1=h:1"])
def test_malformed_groups_are_refused(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_groups((text,))


def test_a_group_given_twice_is_refused() -> None:
    with pytest.raises(click.BadParameter, match="twice"):
        parse_groups(("1=h:1", "1=h:2"))


def test_dev_groups_become_node_flags_every_node_hosts() -> None:
    assert sharded_kv_arguments(["n1", "n2"], 0) == []
    arguments = sharded_kv_arguments(["n1", "n2"], 2)
    assert arguments == [
        "--controller",
        "n1,n2",
        "--shard-group",
        "1=n1,n2",
        "--shard-group",
        "2=n1,n2",
    ]
    groups = tuple(arguments[index + 1] for index in range(2, len(arguments), 2))
    assert parse_shard_groups(groups) == {1: ["n1", "n2"], 2: ["n1", "n2"]}


def test_an_unreachable_controller_is_one_error_line() -> None:
    port = free_ports(1)[0]  # nothing listens there
    result = subprocess.run(
        [*QUORUMLOG, "shard", "query", "--endpoints", f"127.0.0.1:{port}", "--timeout", "0.2"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: query configuration -1: no node could serve it")
    assert result.stderr.count("\n") == 1, result.stderr
