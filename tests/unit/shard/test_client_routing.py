"""The sharded client's decisions without I/O: routing by the cached configuration, keeping
a group's leader across configurations, the retry budget across routings, and the rows of
`quorumlog shard status`."""

from __future__ import annotations

import pytest

from quorumlog.codec.wire import ShardStatusResponse
from quorumlog.errors import (
    ClientError,
    RequestRejectedError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.kv.connection import BACKOFF_SECONDS_INITIAL, EndpointSelector, RequestAttempts
from quorumlog.shard.admin import GroupStatus, group_status, shard_rows
from quorumlog.shard.client import (
    REROUTE_BACKOFF_SECONDS_MAX,
    RoutedCall,
    ShardRouter,
    controller_result,
    group_unreachable,
    names_node_ids,
    resolve_servers,
)
from quorumlog.shard.config import empty_configuration, make_configuration, shard_for_key
from quorumlog.shard.controller_commands import ControllerResult, encode_results

GROUP_ONE = ["127.0.0.1:7001", "127.0.0.1:7002"]
GROUP_TWO = ["127.0.0.1:7101", "127.0.0.1:7102"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def two_groups(number: int = 1) -> ShardRouter:
    router = ShardRouter()
    router.learn(make_configuration(number, [1, 2, 1, 2], {1: GROUP_ONE, 2: GROUP_TWO}))
    return router


def test_keys_route_by_stable_hash_to_the_owning_group() -> None:
    router = two_groups()
    for key in ("alpha", "beta", "gamma", "delta"):
        shard = shard_for_key(key, 4)
        assert router.shard_of(key) == shard
        assert router.gid_of_key(key) == [1, 2, 1, 2][shard]


def test_nothing_routes_before_a_configuration_or_to_an_unassigned_shard() -> None:
    router = ShardRouter()
    assert router.shard_of("key") is None
    assert router.gid_of_key("key") is None
    router.learn(empty_configuration(4))
    assert router.gid_of_key("key") is None


def test_only_a_newer_configuration_is_adopted() -> None:
    router = two_groups(number=5)
    older = make_configuration(4, [2, 2, 2, 2], {2: GROUP_TWO})
    assert router.learn(older) is False
    assert router.configuration is not None and router.configuration.number == 5
    assert router.learn(make_configuration(5, [2, 2, 2, 2], {2: GROUP_TWO})) is False
    assert router.learn(make_configuration(6, [2, 2, 2, 2], {2: GROUP_TWO})) is True


def test_a_group_keeps_its_cached_leader_while_its_servers_stay() -> None:
    router = two_groups()
    router.selector(1).succeeded_at_leader(GROUP_ONE[1])
    router.selector(2).succeeded_at_leader(GROUP_TWO[1])
    moved = make_configuration(2, [2, 2, 1, 2], {1: GROUP_ONE, 2: ["127.0.0.1:7201"]})
    assert router.learn(moved)
    assert router.selector(1).choose() == GROUP_ONE[1], "same servers: the leader stays"
    assert router.selector(2).endpoints == ["127.0.0.1:7201"], "new servers: a new selector"
    left = make_configuration(3, [1, 1, 1, 1], {1: GROUP_ONE})
    assert router.learn(left)
    assert 2 not in router.selectors


def attempts_for(
    selector: EndpointSelector, clock: FakeClock, side_effects: bool
) -> RequestAttempts:
    return RequestAttempts("put 'key'", selector, clock, 5.0, 1.0, side_effects=side_effects)


def test_a_group_is_unreachable_after_two_failed_passes_over_its_servers() -> None:
    clock = FakeClock()
    attempts = attempts_for(EndpointSelector(GROUP_ONE), clock, side_effects=True)
    for _ in range(3):
        attempts.connect_failed(GROUP_ONE[0], ConnectionRefusedError())
        assert not group_unreachable(attempts)
    attempts.connect_failed(GROUP_ONE[1], ConnectionRefusedError())
    assert group_unreachable(attempts)


def test_a_write_that_may_have_reached_any_group_ends_unknown() -> None:
    clock = FakeClock()
    call = RoutedCall("append 'key'", clock, 2.0, side_effects=True)
    first = attempts_for(EndpointSelector(GROUP_ONE), clock, side_effects=True)
    first.sent()
    first.lost(GROUP_ONE[0], TimeoutError())
    call.round_ended(first)
    second = attempts_for(EndpointSelector(GROUP_TWO), clock, side_effects=True)
    call.round_ended(second)  # the next routing sent nothing: the first may still apply
    clock.now += 2.0
    assert call.remaining_seconds() <= 0
    assert isinstance(call.give_up_error(), UnknownOutcomeError)


def test_a_write_never_sent_and_any_read_end_unavailable() -> None:
    clock = FakeClock()
    write = RoutedCall("put 'key'", clock, 1.0, side_effects=True)
    write.failed("no group owns the shard of 'key'")
    error = write.give_up_error()
    assert isinstance(error, UnavailableError)
    assert "no group owns the shard" in str(error)
    read = RoutedCall("get 'key'", clock, 1.0, side_effects=False)
    attempts = attempts_for(EndpointSelector(GROUP_ONE), clock, side_effects=False)
    attempts.sent()
    read.round_ended(attempts)
    assert isinstance(read.give_up_error(), UnavailableError)


def test_rerouting_waits_longer_while_the_configuration_stays_and_not_after_it_moved() -> None:
    call = RoutedCall("get 'key'", FakeClock(), 10.0, side_effects=False)
    pauses = [call.pause_seconds(configuration_changed=False) for _ in range(8)]
    assert pauses[0] == BACKOFF_SECONDS_INITIAL
    assert pauses == sorted(pauses)
    assert max(pauses) == REROUTE_BACKOFF_SECONDS_MAX
    assert call.pause_seconds(configuration_changed=True) == 0.0
    assert call.pause_seconds(configuration_changed=False) == BACKOFF_SECONDS_INITIAL


def test_a_pause_never_runs_past_the_deadline() -> None:
    clock = FakeClock()
    call = RoutedCall("get 'key'", clock, 0.001, side_effects=False)
    clock.now += 0.0005
    assert call.pause_seconds(configuration_changed=False) == pytest.approx(0.0005)
    assert BACKOFF_SECONDS_INITIAL > 0.0005


def test_controller_results_are_checked() -> None:
    ok = ControllerResult(ok=True, configuration_number=3)
    assert controller_result(encode_results([ok]), "join") == ok
    with pytest.raises(RequestRejectedError, match="group 9 is not in configuration"):
        controller_result(
            encode_results([ControllerResult(ok=False, error="group 9 is not in configuration")]),
            "move",
        )
    with pytest.raises(Exception, match="2 results"):
        controller_result(encode_results([ok, ok]), "join")


# --- status -------------------------------------------------------------------------------


def replica(
    node_id: str, is_leader: bool, number: int, states: dict[int, str], leader: str | None
) -> ShardStatusResponse:
    return ShardStatusResponse(
        request_id=1,
        node_id=node_id,
        gid=1,
        is_leader=is_leader,
        leader=leader,
        configuration_number=number,
        shard_states=states,
        stored_keys=len(states),
        applied_index=10,
    )


def test_a_group_is_described_by_its_leader_else_its_most_advanced_replica() -> None:
    behind = replica("n2", False, 3, {0: "pulling"}, None)
    leading = replica("n1", True, 3, {0: "serving"}, GROUP_ONE[0])
    ahead = replica("n3", False, 4, {0: "pulling", 1: "pulling"}, GROUP_ONE[0])
    with_leader = group_status(1, GROUP_ONE, [behind, leading, ahead], [])
    assert with_leader.shard_states == {0: "serving"}
    assert with_leader.leader == GROUP_ONE[0]
    without_leader = group_status(1, GROUP_ONE, [behind, ahead], ["n1: down"])
    assert without_leader.configuration_number == 4
    assert without_leader.errors == ["n1: down"]
    silent = group_status(1, GROUP_ONE, [], ["n1: down", "n2: down"])
    assert silent.configuration_number is None and silent.leader is None


def test_status_rows_show_each_owner_and_copies_still_moving() -> None:
    configuration = make_configuration(3, [1, 2, 2], {1: GROUP_ONE, 2: GROUP_TWO})
    groups = [
        GroupStatus(1, GROUP_ONE, "a:1", 3, {0: "serving", 1: "be_pulling"}, 5, []),
        GroupStatus(2, GROUP_TWO, "b:1", 3, {1: "pulling", 2: "serving"}, 5, []),
    ]
    rows = [
        (row.shard, row.gid, row.state, row.leader) for row in shard_rows(configuration, groups)
    ]
    assert rows == [
        (0, 1, "serving", "a:1"),
        (1, 1, "be_pulling", "a:1"),
        (1, 2, "pulling", "b:1"),
        (2, 2, "serving", "b:1"),
    ]


def test_status_rows_for_unassigned_shards_and_silent_groups() -> None:
    assert {row.state for row in shard_rows(empty_configuration(2), [])} == {"unassigned"}
    configuration = make_configuration(1, [1, 1], {1: GROUP_ONE})
    silent = GroupStatus(1, GROUP_ONE, None, None, {}, None, ["down"])
    assert [row.state for row in shard_rows(configuration, [silent])] == ["unknown", "unknown"]


# --- servers named by node id ----------------------------------------------------------------


def by_node_id(number: int = 1) -> ShardRouter:
    router = ShardRouter()
    router.learn(make_configuration(number, [1, 1, 1, 1], {1: ["n1", "n2", "127.0.0.1:7301"]}))
    return router


def test_node_ids_resolve_to_where_a_node_says_they_listen() -> None:
    router = by_node_id()
    assert names_node_ids(router.configuration)  # type: ignore[arg-type]
    assert router.endpoints_of(1) == ["127.0.0.1:7301"], "unknown ids are left out"
    assert router.learn_addresses({"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002"})
    assert router.endpoints_of(1) == ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7301"]
    assert router.selector(1).endpoints == router.endpoints_of(1)


def test_a_moved_server_makes_a_new_selector_an_unmoved_one_keeps_the_leader() -> None:
    router = by_node_id()
    router.learn_addresses({"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002"})
    router.selector(1).succeeded_at_leader("127.0.0.1:7002")
    assert not router.learn_addresses({"n1": "127.0.0.1:7001", "n2": "127.0.0.1:7002"})
    assert router.selector(1).choose() == "127.0.0.1:7002", "nothing moved: the leader stays"
    assert router.learn_addresses({"n2": "127.0.0.1:7102"})  # n2 restarted on a new port
    assert router.selector(1).endpoints == ["127.0.0.1:7001", "127.0.0.1:7102", "127.0.0.1:7301"]
    assert router.selector(1).leader is None


def test_a_group_with_no_known_server_cannot_be_asked() -> None:
    router = ShardRouter()
    router.learn(make_configuration(1, [1, 1, 1, 1], {1: ["n1", "n2"]}))
    assert router.endpoints_of(1) == []
    with pytest.raises(ClientError, match="no server of group 1"):
        router.selector(1)


def test_servers_given_as_addresses_need_no_lookup() -> None:
    assert not names_node_ids(make_configuration(1, [1, 1, 1, 1], {1: GROUP_ONE}))
    assert resolve_servers(["n1", "h:1", "n1"], {"n1": "h:2"}) == ["h:2", "h:1"]
