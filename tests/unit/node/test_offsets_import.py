"""The coordinator leader carries over the previous release's `__offsets/` keys once per
leadership (node/offsets_import.py), on a manual scheduler and a one-replica stand-in
group: requests wait until the import is applied, the keys imported are deleted, a failed
read is retried, a new leadership imports again (changing nothing), and keys that do not
parse are left as they are."""

from __future__ import annotations

from quorumlog.codec import wire
from quorumlog.node.group_coordinator_service import GroupCoordinatorService
from quorumlog.node.offsets_import import KeyValues, parse_previous_offsets
from quorumlog.runtime.completion import Completion
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.stream.group_model import (
    DescribeGroup,
    GroupCommand,
    GroupResult,
    PartitionOffset,
    decode_results,
    encode_commands,
)
from quorumlog.testing.manual import ManualScheduler
from tests.unit.node.test_group_coordinator_service import CHECK_SECONDS, OneReplicaGroup


class KeysInMemory:
    """The "kv" group's `__offsets/` keys; reads wait while `held`, or fail while `failing`."""

    def __init__(self, scheduler: ManualScheduler, items: dict[str, str]) -> None:
        self.scheduler = scheduler
        self.items = dict(items)
        self.held = False
        self.failing = 0
        self.reads = 0
        self.waiting: list[Completion[KeyValues]] = []

    def read(self) -> Completion[KeyValues]:
        self.reads += 1
        completion: Completion[KeyValues] = Completion(self.scheduler)
        if self.failing:
            self.failing -= 1
            completion.set_exception(ConnectionResetError("no kv leader"))
        elif self.held:
            self.waiting.append(completion)
        else:
            completion.set_result(sorted(self.items.items()))
        return completion

    def release(self) -> None:
        self.held = False
        for completion in self.waiting:
            completion.set_result(sorted(self.items.items()))
        self.waiting.clear()

    def delete(self, items: KeyValues) -> Completion[None]:
        for key, value in items:
            if self.items.get(key) == value:
                del self.items[key]
        completion: Completion[None] = Completion(self.scheduler)
        completion.set_result(None)
        return completion


class Harness:
    def __init__(self, items: dict[str, str]) -> None:
        self.scheduler = ManualScheduler()
        self.machine = GroupCoordinatorMachine()
        self.group = OneReplicaGroup(self.scheduler, self.machine)
        self.keys = KeysInMemory(self.scheduler, items)
        self.service = GroupCoordinatorService(
            self.group,  # type: ignore[arg-type]
            self.machine,
            lambda: None,
            lambda topic: 0,
            CHECK_SECONDS,
            previous_offsets=self.keys,
        )
        self.service.start()

    def ask(self, command: GroupCommand) -> wire.Frame:
        answers: list[wire.Frame] = []
        request = wire.GroupCoordinatorRequest(request_id=1, commands=encode_commands([command]))
        self.service.handle(request, answers.append)
        self.scheduler.run_until_idle()
        [answer] = answers
        return answer

    def describe(self, group: str) -> GroupResult:
        answer = self.ask(DescribeGroup(group))
        assert isinstance(answer, wire.GroupCoordinatorResponse), answer
        [result] = decode_results(answer.results)
        return result

    def offsets(self, group: str) -> list[tuple[str, int, int]]:
        info = self.machine.group_info(group)
        assert info is not None, f"no group {group!r}"
        return [(o.topic, o.partition, o.offset) for o in info.offsets]


OLD_KEYS = {
    "__offsets/g/t/0": "7",
    "__offsets/g/t/1": "12",
    "__offsets/g/a/b/3": "5",  # a topic name may hold "/"
    "__offsets/h/t/0": "2",
}


def test_requests_wait_for_the_import_then_the_old_keys_are_gone() -> None:
    harness = Harness(OLD_KEYS)
    harness.keys.held = True
    harness.scheduler.advance(CHECK_SECONDS)
    assert harness.keys.reads == 1
    answer = harness.ask(DescribeGroup("g"))
    assert isinstance(answer, wire.ErrorResponse)
    assert answer.code is wire.ErrorCode.UNAVAILABLE  # clients retry it
    assert "previous release" in answer.message
    harness.scheduler.advance(1.0)
    assert harness.keys.reads == 1  # one attempt at a time
    harness.keys.release()
    harness.scheduler.run_until_idle()
    assert harness.describe("g").ok
    assert harness.offsets("g") == [("a/b", 3, 5), ("t", 0, 7), ("t", 1, 12)]
    assert harness.offsets("h") == [("t", 0, 2)]
    assert harness.keys.items == {}


def test_a_failed_read_is_retried_and_a_new_leadership_changes_nothing() -> None:
    harness = Harness(OLD_KEYS)
    harness.keys.failing = 1
    harness.scheduler.advance(CHECK_SECONDS)
    assert harness.keys.reads == 1
    answer = harness.ask(DescribeGroup("g"))
    assert isinstance(answer, wire.ErrorResponse)
    harness.scheduler.advance(1.5)  # past the retry delay
    assert harness.keys.reads == 2
    assert harness.offsets("g") == [("a/b", 3, 5), ("t", 0, 7), ("t", 1, 12)]
    # A crash before the delete: the keys are back, and a commit came meanwhile.
    harness.keys.items = dict(OLD_KEYS)
    harness.machine.groups["g"].offsets["t"][0] = 40
    applied_index = harness.group.index
    harness.scheduler.advance(1.0)
    assert harness.keys.reads == 2  # once per leadership
    harness.group.is_leader = False
    harness.scheduler.advance(CHECK_SECONDS)
    harness.group.is_leader = True
    harness.scheduler.advance(CHECK_SECONDS)
    assert harness.keys.reads == 3
    assert harness.group.index > applied_index  # the import went through the log again
    assert harness.offsets("g") == [("a/b", 3, 5), ("t", 0, 40), ("t", 1, 12)]
    assert harness.keys.items == {}


def test_nothing_to_import_proposes_nothing_and_serves_at_once() -> None:
    harness = Harness({})
    harness.scheduler.advance(CHECK_SECONDS)
    assert harness.group.index == 0
    assert harness.describe("g").refusal is not None  # unknown group, answered


def test_keys_that_do_not_parse_are_left_alone() -> None:
    offsets, malformed = parse_previous_offsets(
        [
            ("__offsets/g/t/0", " 7\n"),
            ("__offsets/g/t/x", "1"),
            ("__offsets/g/t/1", "-3"),
            ("__offsets/g/t/2", "٣"),
            ("__offsets/g", "1"),
            ("__offsets//t/0", "1"),
        ]
    )
    assert offsets == {"g": [PartitionOffset("t", 0, 7)]}
    assert [key for key, _ in malformed] == [
        "__offsets/g/t/x",
        "__offsets/g/t/1",
        "__offsets/g/t/2",
        "__offsets/g",
        "__offsets//t/0",
    ]
    harness = Harness({"__offsets/g/t/0": " 7\n", "__offsets/g/t/x": "1"})
    harness.scheduler.advance(CHECK_SECONDS)
    assert harness.offsets("g") == [("t", 0, 7)]
    # The imported key went as it was read (" 7\n"); the one that does not parse stayed.
    assert harness.keys.items == {"__offsets/g/t/x": "1"}
