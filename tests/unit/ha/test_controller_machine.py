"""HAControllerMachine (reference 003): registration, heartbeats, elections from the
SyncStateSet, AlterSyncStateSet refusals, deduplication, snapshots."""

from __future__ import annotations

import random

import msgspec
import pytest

from quorumlog.ha.controller_machine import HAControllerMachine, HAControllerSnapshot
from quorumlog.ha.controller_model import (
    AlterSyncStateSet,
    BrokerGroupInfo,
    BrokerHeartbeat,
    ConfigureGroup,
    ElectMaster,
    GetGroup,
    HAControllerBatch,
    HAControllerCommand,
    HAControllerEntry,
    HAControllerResult,
    ListGroups,
    Refusal,
    RegisterBroker,
    encode_entry,
)
from quorumlog.kv.machine import MalformedEntryError

TIMEOUT_MS = 1_000


class Driver:
    """Feeds one command per entry, stamped with a clock the test moves."""

    def __init__(self, machine: HAControllerMachine | None = None) -> None:
        self.machine = machine or HAControllerMachine(broker_heartbeat_timeout_ms=TIMEOUT_MS)
        self.now_ms = 1_000_000
        self.index = 0
        self.sequence = 0

    def run(self, command: HAControllerCommand, client_id: str = "c") -> HAControllerResult:
        self.sequence += 1
        command = msgspec.structs.replace(command, sequence=self.sequence)
        return self.run_raw(command, client_id)

    def run_raw(self, command: HAControllerCommand, client_id: str = "c") -> HAControllerResult:
        self.index += 1
        entry = HAControllerEntry(
            timestamp_ms=self.now_ms,
            batches=[HAControllerBatch(client_id, 0, [command])],
        )
        [[result]] = self.machine.apply(self.index, encode_entry(entry))
        return result

    def ok(self, command: HAControllerCommand) -> BrokerGroupInfo:
        result = self.run(command)
        assert result.ok, result.error
        assert result.group is not None
        return result.group

    def refusal(self, command: HAControllerCommand) -> Refusal | None:
        result = self.run(command)
        assert not result.ok
        return result.refusal

    def register(self, *brokers: str, group: str = "g") -> BrokerGroupInfo:
        info = None
        for broker in brokers:
            info = self.ok(RegisterBroker(group, broker, f"{broker}:1"))
        assert info is not None
        return info

    def beat(self, broker: str, max_offset: int = 0, epoch: int = 0) -> BrokerGroupInfo:
        return self.ok(BrokerHeartbeat("g", broker, max_offset, epoch))

    def advance(self, milliseconds: int) -> None:
        self.now_ms += milliseconds

    def full_set(self, *members: str) -> BrokerGroupInfo:
        """Have the master put `members` in its SyncStateSet."""
        info = self.machine.group_info("g")
        assert info is not None and info.master_id is not None
        return self.ok(
            AlterSyncStateSet(
                "g", info.master_id, info.master_epoch, info.sync_state_set_epoch, list(members)
            )
        )


# --- registration and heartbeats ---------------------------------------------------------


def test_first_broker_of_a_new_group_becomes_master_at_epoch_1() -> None:
    driver = Driver()
    info = driver.register("a", "b", "c")
    assert info.master_id == "a"
    assert info.master_epoch == 1
    assert info.sync_state_set == ["a"]
    assert info.sync_state_set_epoch == 1
    assert [broker.broker_id for broker in info.brokers] == ["a", "b", "c"]
    assert all(broker.alive for broker in info.brokers)


def test_reregistering_updates_the_address_and_elects_nobody() -> None:
    driver = Driver()
    driver.register("a", "b")
    info = driver.ok(RegisterBroker("g", "b", "elsewhere:2"))
    assert info.master_id == "a" and info.master_epoch == 1
    assert {broker.broker_id: broker.address for broker in info.brokers}["b"] == "elsewhere:2"


def test_heartbeat_records_offset_and_epoch_and_answers_with_the_group() -> None:
    driver = Driver()
    driver.register("a", "b")
    info = driver.beat("b", max_offset=4096, epoch=1)
    broker = {broker.broker_id: broker for broker in info.brokers}["b"]
    assert (broker.max_offset, broker.epoch, broker.last_heartbeat_ms) == (4096, 1, driver.now_ms)


def test_heartbeat_from_an_unregistered_broker_is_refused() -> None:
    driver = Driver()
    assert driver.refusal(BrokerHeartbeat("nope", "a", 0, 0)) is Refusal.UNKNOWN_GROUP
    driver.register("a")
    assert driver.refusal(BrokerHeartbeat("g", "zz", 0, 0)) is Refusal.UNKNOWN_BROKER


def test_a_broker_goes_dead_after_the_heartbeat_timeout() -> None:
    driver = Driver()
    driver.register("a", "b")
    driver.advance(TIMEOUT_MS + 1)
    info = driver.beat("b")
    assert {broker.broker_id: broker.alive for broker in info.brokers} == {"a": False, "b": True}


def test_group_and_broker_limits_are_refused() -> None:
    machine = HAControllerMachine(
        broker_heartbeat_timeout_ms=TIMEOUT_MS, group_count_max=1, brokers_per_group_max=2
    )
    driver = Driver(machine)
    driver.register("a", "b")
    assert driver.refusal(RegisterBroker("g", "c", "c:1")) is Refusal.LIMIT_EXCEEDED
    assert driver.refusal(RegisterBroker("h", "x", "x:1")) is Refusal.LIMIT_EXCEEDED
    assert driver.refusal(RegisterBroker("g", "", "c:1")) is Refusal.BAD_REQUEST


# --- automatic elections ---------------------------------------------------------------------


def three_in_sync(driver: Driver) -> None:
    driver.register("a", "b", "c")
    driver.full_set("a", "b", "c")


def test_a_silent_master_is_replaced_by_the_most_caught_up_alive_member() -> None:
    driver = Driver()
    three_in_sync(driver)
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("b", max_offset=100, epoch=1)
    driver.beat("c", max_offset=200, epoch=1)
    assert driver.machine.groups_needing_election(driver.now_ms) == [("g", 1)]
    info = driver.ok(ElectMaster("g", automatic=True, expected_master_epoch=1))
    assert info.master_id == "c"
    assert info.master_epoch == 2
    assert info.sync_state_set == ["c"]
    assert info.sync_state_set_epoch == 3


def test_a_higher_epoch_beats_a_higher_offset() -> None:
    driver = Driver()
    three_in_sync(driver)
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("b", max_offset=500, epoch=1)
    driver.beat("c", max_offset=200, epoch=2)
    assert driver.ok(ElectMaster("g", automatic=True)).master_id == "c"


def test_ties_go_to_the_smallest_broker_id() -> None:
    driver = Driver()
    three_in_sync(driver)
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("c", max_offset=7, epoch=1)
    driver.beat("b", max_offset=7, epoch=1)
    assert driver.ok(ElectMaster("g", automatic=True)).master_id == "b"


def test_never_elects_outside_the_sync_state_set() -> None:
    driver = Driver()
    driver.register("a", "b", "c")
    driver.full_set("a", "b")
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("b")
    driver.beat("c", max_offset=10_000, epoch=9)  # more data, but not in sync: never chosen
    assert driver.ok(ElectMaster("g", automatic=True)).master_id == "b"


def test_no_alive_member_leaves_the_group_without_master_under_a_new_epoch() -> None:
    driver = Driver()
    driver.register("a", "b", "c")
    driver.full_set("a", "b")
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("c")
    info = driver.ok(ElectMaster("g", automatic=True, expected_master_epoch=1))
    assert info.master_id is None
    assert info.master_epoch == 2
    assert info.sync_state_set == ["a", "b"]  # kept: a member that returns may be elected
    assert driver.machine.groups_needing_election(driver.now_ms) == []
    assert driver.refusal(ElectMaster("g", automatic=True)) is Refusal.NO_ELIGIBLE_MASTER
    driver.beat("b")
    assert driver.machine.groups_needing_election(driver.now_ms) == [("g", 2)]
    info = driver.ok(ElectMaster("g", automatic=True, expected_master_epoch=2))
    assert (info.master_id, info.master_epoch, info.sync_state_set) == ("b", 3, ["b"])


def test_unclean_election_only_when_the_group_allows_it() -> None:
    driver = Driver()
    driver.register("a", "b", "c")
    driver.full_set("a", "b")
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("c")
    assert driver.refusal(ElectMaster("g", broker_id="c")) is Refusal.BROKER_NOT_ELIGIBLE
    driver.ok(ConfigureGroup("g", allow_unclean_election=True))
    info = driver.ok(ElectMaster("g", automatic=True))
    assert (info.master_id, info.master_epoch) == ("c", 2)


def test_unclean_still_prefers_the_sync_state_set() -> None:
    driver = Driver()
    driver.register("a", "b", "c")
    driver.full_set("a", "b")
    driver.ok(ConfigureGroup("g", allow_unclean_election=True))
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("b")
    driver.beat("c", max_offset=10_000, epoch=9)
    assert driver.ok(ElectMaster("g", automatic=True)).master_id == "b"


def test_automatic_election_for_a_master_that_beats_again_does_nothing() -> None:
    driver = Driver()
    three_in_sync(driver)
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("a")
    assert driver.machine.groups_needing_election(driver.now_ms) == []
    assert driver.refusal(ElectMaster("g", automatic=True)) is Refusal.MASTER_STILL_ALIVE
    assert driver.machine.group_info("g") == driver.ok(GetGroup("g"))


def test_two_leaders_electing_for_the_same_epoch_elect_once() -> None:
    driver = Driver()
    three_in_sync(driver)
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("b")
    driver.beat("c")
    first = driver.ok(ElectMaster("g", automatic=True, expected_master_epoch=1))
    second = ElectMaster("g", automatic=True, expected_master_epoch=1)
    assert driver.refusal(second) is Refusal.STALE_MASTER_EPOCH
    assert driver.machine.group_info("g") == first


# --- admin elections -------------------------------------------------------------------------


def test_admin_names_an_alive_member_to_switch_over() -> None:
    driver = Driver()
    three_in_sync(driver)
    info = driver.ok(ElectMaster("g", broker_id="b"))
    assert (info.master_id, info.master_epoch, info.sync_state_set) == ("b", 2, ["b"])


def test_admin_election_refusals() -> None:
    driver = Driver()
    three_in_sync(driver)
    assert driver.refusal(ElectMaster("g", broker_id="a")) is Refusal.MASTER_STILL_ALIVE
    assert driver.refusal(ElectMaster("g")) is Refusal.MASTER_STILL_ALIVE
    assert driver.refusal(ElectMaster("g", broker_id="zz")) is Refusal.UNKNOWN_BROKER
    assert driver.refusal(ElectMaster("nope")) is Refusal.UNKNOWN_GROUP
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("a")
    assert driver.refusal(ElectMaster("g", broker_id="b")) is Refusal.BROKER_NOT_ELIGIBLE


def test_admin_without_a_broker_replaces_a_dead_master() -> None:
    driver = Driver()
    three_in_sync(driver)
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("c")
    assert driver.ok(ElectMaster("g")).master_id == "c"


# --- AlterSyncStateSet -----------------------------------------------------------------------


def test_alter_from_the_master_at_current_epochs_bumps_the_set_epoch() -> None:
    driver = Driver()
    driver.register("a", "b", "c")
    info = driver.ok(AlterSyncStateSet("g", "a", 1, 1, ["c", "a"]))
    assert (info.sync_state_set, info.sync_state_set_epoch) == (["a", "c"], 2)
    info = driver.ok(AlterSyncStateSet("g", "a", 1, 2, ["a"]))
    assert (info.sync_state_set, info.sync_state_set_epoch) == (["a"], 3)


@pytest.mark.parametrize(
    ("command", "refusal"),
    [
        (AlterSyncStateSet("g", "b", 1, 1, ["b", "a"]), Refusal.NOT_MASTER),
        (AlterSyncStateSet("g", "a", 0, 1, ["a", "b"]), Refusal.STALE_MASTER_EPOCH),
        (AlterSyncStateSet("g", "a", 2, 1, ["a", "b"]), Refusal.STALE_MASTER_EPOCH),
        (AlterSyncStateSet("g", "a", 1, 0, ["a", "b"]), Refusal.STALE_SYNC_STATE_SET_EPOCH),
        (AlterSyncStateSet("g", "a", 1, 1, ["b"]), Refusal.INVALID_SYNC_STATE_SET),
        (AlterSyncStateSet("g", "a", 1, 1, ["a", "b", "b"]), Refusal.INVALID_SYNC_STATE_SET),
        (AlterSyncStateSet("g", "a", 1, 1, ["a", "zz"]), Refusal.INVALID_SYNC_STATE_SET),
        (AlterSyncStateSet("h", "a", 1, 1, ["a"]), Refusal.UNKNOWN_GROUP),
    ],
)
def test_bad_alter_is_refused_and_changes_nothing(
    command: AlterSyncStateSet, refusal: Refusal
) -> None:
    driver = Driver()
    before = driver.register("a", "b")
    assert driver.refusal(command) is refusal
    assert driver.machine.group_info("g") == before


def test_alter_from_a_deposed_master_is_refused() -> None:
    """The old master's request with its old epochs after a switch-over (#6316's shape)."""
    driver = Driver()
    three_in_sync(driver)
    driver.ok(ElectMaster("g", broker_id="b"))
    stale = AlterSyncStateSet("g", "a", 1, 2, ["a", "c"])
    assert driver.refusal(stale) is Refusal.NOT_MASTER
    assert driver.machine.group_info("g") is not None
    assert driver.ok(GetGroup("g")).sync_state_set == ["b"]


def test_alter_may_not_add_a_dead_broker_but_may_keep_or_drop_one() -> None:
    driver = Driver()
    driver.register("a", "b", "c")
    driver.full_set("a", "b")
    driver.advance(TIMEOUT_MS + 1)
    driver.beat("a")
    assert driver.refusal(AlterSyncStateSet("g", "a", 1, 2, ["a", "b", "c"])) is (
        Refusal.INVALID_SYNC_STATE_SET
    )
    assert driver.ok(AlterSyncStateSet("g", "a", 1, 2, ["a"])).sync_state_set == ["a"]


# --- deduplication, determinism, snapshots -----------------------------------------------------


def test_a_retried_alter_is_applied_once_and_gets_the_first_answer() -> None:
    driver = Driver()
    driver.register("a", "b", "c")
    command = AlterSyncStateSet("g", "a", 1, 1, ["a", "b"], sequence=100)
    first = driver.run_raw(command)
    again = driver.run_raw(command)
    assert first.ok and again == first
    assert driver.machine.duplicate_count == 1
    assert driver.ok(GetGroup("g")).sync_state_set_epoch == 2


def test_list_groups_is_sorted() -> None:
    driver = Driver()
    driver.register("a", group="zeta")
    driver.register("a", group="alpha")
    result = driver.run(ListGroups())
    assert result.groups is not None
    assert [info.group for info in result.groups] == ["alpha", "zeta"]


def random_history(seed: int, steps: int) -> list[tuple[int, HAControllerCommand]]:
    """A seeded mix of every command, with clock jumps that kill and revive brokers."""
    rng = random.Random(seed)
    brokers = ["a", "b", "c", "d"]
    history: list[tuple[int, HAControllerCommand]] = []
    now_ms = 0
    for sequence in range(1, steps + 1):
        now_ms += rng.choice([10, 100, 600, TIMEOUT_MS + 1])
        group = rng.choice(["g", "h"])
        broker = rng.choice(brokers)
        members = rng.sample(brokers, rng.randint(1, 4))
        command: HAControllerCommand = rng.choice(
            [
                RegisterBroker(group, broker, f"{broker}:1", sequence),
                BrokerHeartbeat(group, broker, rng.randint(0, 9), rng.randint(0, 5)),
                BrokerHeartbeat(group, broker, rng.randint(0, 9), rng.randint(0, 5)),
                ElectMaster(group, None, True, None, sequence),
                ElectMaster(group, rng.choice([None, broker]), False, None, sequence),
                AlterSyncStateSet(group, broker, rng.randint(0, 5), rng.randint(0, 5), members),
                ConfigureGroup(group, rng.random() < 0.3, sequence),
            ]
        )
        history.append((now_ms, command))
    return history


def apply_history(history: list[tuple[int, HAControllerCommand]]) -> HAControllerMachine:
    machine = HAControllerMachine(broker_heartbeat_timeout_ms=TIMEOUT_MS)
    for index, (now_ms, command) in enumerate(history, start=1):
        entry = HAControllerEntry(now_ms, [HAControllerBatch("c", 0, [command])])
        machine.apply(index, encode_entry(entry))
    return machine


def test_master_epoch_never_goes_back_and_new_masters_come_from_the_set() -> None:
    for seed in range(20):
        machine = HAControllerMachine(broker_heartbeat_timeout_ms=TIMEOUT_MS)
        for index, (now_ms, command) in enumerate(random_history(seed, 200), start=1):
            before = machine.group_info("g")
            entry = HAControllerEntry(now_ms, [HAControllerBatch("c", 0, [command])])
            machine.apply(index, encode_entry(entry))
            after = machine.group_info("g")
            if before is None or after is None:
                continue
            assert after.master_epoch >= before.master_epoch, seed
            assert after.sync_state_set_epoch >= before.sync_state_set_epoch, seed
            if after.master_epoch > before.master_epoch and after.master_id is not None:
                unclean = before.allow_unclean_election or not before.sync_state_set
                assert unclean or after.master_id in before.sync_state_set, seed


def test_replicas_applying_the_same_log_hold_the_same_snapshot_bytes() -> None:
    history = random_history(seed=7, steps=300)
    assert apply_history(history).snapshot() == apply_history(history).snapshot()


def test_snapshot_restores_to_the_same_bytes_and_the_same_future() -> None:
    history = random_history(seed=11, steps=300)
    original = apply_history(history[:150])
    restored = HAControllerMachine(broker_heartbeat_timeout_ms=TIMEOUT_MS)
    restored.restore(original.snapshot())
    assert restored.snapshot() == original.snapshot()
    for index, (now_ms, command) in enumerate(history[150:], start=151):
        entry = encode_entry(HAControllerEntry(now_ms, [HAControllerBatch("c", 0, [command])]))
        assert restored.apply(index, entry) == original.apply(index, entry)
    assert restored.snapshot() == original.snapshot()


def test_a_snapshot_of_another_format_or_bad_bytes_is_refused() -> None:
    machine = apply_history(random_history(seed=3, steps=20))
    decoded = msgspec.msgpack.decode(machine.snapshot(), type=HAControllerSnapshot)
    future = msgspec.structs.replace(decoded, format_version=99)
    fresh = HAControllerMachine()
    with pytest.raises(MalformedEntryError, match="format 99"):
        fresh.restore(msgspec.msgpack.encode(future))
    with pytest.raises(MalformedEntryError):
        fresh.restore(b"\x00garbage")
    assert fresh.groups == {}


def test_an_entry_that_does_not_decode_is_corruption() -> None:
    with pytest.raises(MalformedEntryError, match="entry 1"):
        HAControllerMachine().apply(1, b"\xc1")


def test_snapshot_bytes_do_not_depend_on_the_order_brokers_registered_in() -> None:
    forward, backward = Driver(), Driver()
    forward.register("a", "b", "c", group="h")
    forward.register("x", group="g")
    backward.register("x", group="g")
    backward.register("a", "c", "b", group="h")
    restored = HAControllerMachine(broker_heartbeat_timeout_ms=TIMEOUT_MS)
    restored.restore(backward.machine.snapshot())
    assert restored.snapshot() == backward.machine.snapshot()
    state = forward.machine.groups["h"]
    assert list(state.brokers) == ["a", "b", "c"]
    # Same groups and brokers, different arrival order: only the sessions differ.
    forward_groups = msgspec.msgpack.decode(forward.machine.snapshot(), type=HAControllerSnapshot)
    backward_groups = msgspec.msgpack.decode(backward.machine.snapshot(), type=HAControllerSnapshot)
    assert msgspec.msgpack.encode(forward_groups.groups[1].brokers) == msgspec.msgpack.encode(
        backward_groups.groups[1].brokers
    )
