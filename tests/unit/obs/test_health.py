"""The health decision (etcd's semantics), pure: groups' state and a read's outcome in."""

from __future__ import annotations

from quorumlog.obs.health import GroupState, HealthVerdict, decide_health


def test_every_group_with_a_leader_and_a_read_that_worked_is_healthy() -> None:
    groups = [GroupState("kv", "n1"), GroupState("topic@1/0", "n2")]
    verdict = decide_health(groups, None)
    assert verdict == HealthVerdict(True)
    assert verdict.body() == {"health": "true"}


def test_a_group_without_a_leader_is_named() -> None:
    verdict = decide_health([GroupState("kv", "n1"), GroupState("shard-1", None)], None)
    assert verdict.body() == {"health": "false", "reason": "group shard-1 has no leader"}


def test_a_stopped_group_comes_before_a_missing_leader() -> None:
    groups = [GroupState("a", None), GroupState("b", "n1", failure="InvariantViolation: x")]
    verdict = decide_health(groups, None)
    assert not verdict.healthy
    assert verdict.reason == "group a has no leader"  # sorted by name: "a" first
    assert "stopped" in decide_health([GroupState("b", "n1", "boom")], None).reason


def test_a_failed_read_is_unhealthy_even_with_leaders() -> None:
    verdict = decide_health([GroupState("kv", "n1")], "no node answered in 2.0s")
    assert verdict.body() == {
        "health": "false",
        "reason": "linearizable read failed: no node answered in 2.0s",
    }
