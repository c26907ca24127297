"""A linearizability checker for recorded histories, in the style of Porcupine.

The search is Wing & Gong's, with Lowe's memoization, as Porcupine implements it:

- the history becomes a list of call and return events sorted by time, held in a doubly
  linked list so that an operation can be taken out ("lifted") and put back in O(1);
- a depth-first search tries, from the front of the list, to linearize the next call whose
  model step accepts its output; a return event reached before its call was linearized
  means the current prefix is a dead end, so the search backtracks;
- a cache of (set of linearized operations as a bit set, model state) prunes every
  configuration the search has already explored: from the same set and the same state the
  rest of the search would go exactly the same way.

Unknown outcomes get two more prunings, each explained where it is coded: a configuration
whose unknown operations include those of one already explored is skipped, and so is an
operation that reaches the same state with or without the unknown one just before it.

Histories are split first (P-compositionality): for the key-value model, each key is a
register of its own, so a history of K keys costs K small searches instead of one huge one.

Failed operations are dropped: they did not happen. An unknown operation has no return
event (its return time is +infinity), so it may be linearized anywhere after its call, or
never: the search succeeds once every operation that returned has been linearized. Its
output is `UNKNOWN_OUTPUT`, which a model accepts whatever it would have returned.

Events at the same time are ordered calls first, so operations whose intervals only touch
count as concurrent: that can hide a bug, but never reports one that is not there.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Sequence
from typing import Any, Final, Protocol

import msgspec

from quorumlog.testing.history import HistoryError, Operation, OperationStatus, check_operation


class _UnknownOutput(enum.Enum):
    UNKNOWN_OUTPUT = "unknown output"

    def __repr__(self) -> str:
        return "UNKNOWN_OUTPUT"


UNKNOWN_OUTPUT: Final = _UnknownOutput.UNKNOWN_OUTPUT
"""The output a model is given for an operation whose outcome is unknown: any output the
model would produce there is acceptable."""

TIME_BUDGET_STEPS_DEFAULT: Final = 1_000_000
"""Search steps allowed per partition before the checker gives up (ok is None)."""

_WINDOW_CONTEXT_OPERATIONS_MAX: Final = 3
"""Operations that ended before the culprit's call shown with it, for the state it saw."""

_WINDOW_OPERATIONS_MAX: Final = 12
"""Operations listed in an explanation; the full window stays in the result."""


class Model(Protocol):
    """A sequential specification. States must be hashable (tuples, str, None, numbers)
    and compare equal exactly when they behave the same; `step` must be deterministic, as
    the search prunes by comparing states."""

    def init(self) -> Hashable:
        """The state before any operation."""
        ...

    def step(self, state: Hashable, kind: str, argument: Any, output: Any) -> tuple[bool, Hashable]:
        """Apply one operation: whether `output` is what it returns from `state`, and the
        state after it. `output` may be `UNKNOWN_OUTPUT`, which any result matches."""
        ...

    def partition(self, operations: Sequence[Operation]) -> list[list[Operation]]:
        """Split a history into independent parts, each checked on its own."""
        ...

    def is_read_only(self, kind: str) -> bool:
        """Whether operations of this kind never change the state. Unknown read-only
        operations constrain nothing, so the checker drops them."""
        ...

    def describe_operation(self, kind: str, argument: Any, output: Any) -> str:
        """One short line for explanations, such as "get() -> 'a'"."""
        ...


class RegisterModel:
    """One register holding a value or None (absent), with the key-value store's kinds.

    - "put" (argument: value) and "append" (argument: suffix, added with `+`; appending to
      an absent value stores the suffix) and "delete": their output is not checked;
    - "get": outputs the value, None when absent;
    - "cas" (argument: (expected, new)): sets new and outputs True when the value equals
      expected (None expects absent), else outputs False and changes nothing.

    Every operation of a history goes to the one register, whatever its key.
    """

    kinds: Final = frozenset({"put", "get", "append", "delete", "cas"})

    def init(self) -> Hashable:
        return None

    def step(self, state: Hashable, kind: str, argument: Any, output: Any) -> tuple[bool, Hashable]:
        if kind == "get":
            return output is UNKNOWN_OUTPUT or output == state, state
        if kind == "put":
            return True, argument
        if kind == "append":
            # Appending to an absent value stores the suffix, as the KV store does.
            return True, (argument if state is None else state + argument)
        if kind == "delete":
            return True, None
        if kind == "cas":
            expected, new = argument
            succeeded = state == expected
            if output is not UNKNOWN_OUTPUT and output != succeeded:
                return False, state
            return True, (new if succeeded else state)
        raise HistoryError(f"the register model has no operation kind {kind!r}")

    def partition(self, operations: Sequence[Operation]) -> list[list[Operation]]:
        return [list(operations)] if operations else []

    def without_unobservable(self, operations: Sequence[Operation]) -> list[Operation]:
        """`operations` less the appends of unknown outcome that nothing could have seen.

        An unknown append whose suffix occurs in no other operation's argument or output
        (as a substring) never needs to be linearized, unless a cas that returned False
        might need it: were it linearized somewhere, every state after it would hold its
        suffix until a put or delete replaced the value, and no output or compared value
        holds it, so nothing observed that state; an unknown cas that failed there because
        of it has no effect either way. A cas that returned False is the one observer that
        can see an append without its suffix (it saw "not the expected value", which
        appending anything can cause). Such a cas does not need the unknown append when
        its failure is explained anyway (`failure_is_explained`): an append that completed
        before it was called, whose suffix the expected value lacks, is in the value it
        compared. Dropping the unneeded appends changes no verdict, and the search no longer
        tries them at every position: a few of these, concurrent with long reads, made the
        search blow up (seen in the simulator and on real processes). A substring match
        keeps an append whenever in doubt.
        """
        if not any(
            operation.status is OperationStatus.UNKNOWN and operation.kind == "append"
            for operation in operations
        ):
            return list(operations)  # nothing to drop: skip the scans below
        observed: list[str] = []
        unexplained_failed_cas = [
            operation
            for operation in operations
            if operation.kind == "cas"
            and operation.status is OperationStatus.OK
            and operation.output is False
            and not failure_is_explained(operation, operations)
        ]
        replacing = [operation for operation in operations if replaces_the_value(operation)]
        gets = [
            operation
            for operation in operations
            if operation.kind == "get" and operation.status is OperationStatus.OK
        ]
        for operation in operations:
            for value in (operation.argument, operation.output):
                if isinstance(value, str):
                    observed.append(value)
                elif isinstance(value, tuple | list):
                    observed.extend(item for item in value if isinstance(item, str))
        kept: list[Operation] = []
        for operation in operations:
            suffix = operation.argument
            if (
                operation.status is OperationStatus.UNKNOWN
                and operation.kind == "append"
                and isinstance(suffix, str)
                and suffix
                and sum(1 for value in observed if suffix in value) == 1  # its own argument
                and all(
                    cas.return_time < operation.call_time
                    or seen_after_without(cas, operation, gets, replacing)
                    for cas in unexplained_failed_cas
                )
            ):
                continue
            kept.append(operation)
        return kept

    def is_read_only(self, kind: str) -> bool:
        return kind == "get"

    def describe_operation(self, kind: str, argument: Any, output: Any) -> str:
        shown_output = "?" if output is UNKNOWN_OUTPUT else repr(output)
        if kind == "get":
            return f"get() -> {shown_output}"
        if kind == "delete":
            return "delete()"
        if kind == "cas":
            expected, new = argument
            return f"cas({expected!r} -> {new!r}) -> {shown_output}"
        return f"{kind}({argument!r})"


STATUS_OK = OperationStatus.OK
"""Read once: on Python 3.11 an enum member read through its class costs several times a
global's lookup, and the scans below compare statuses in nested loops."""


def replaces_the_value(operation: Operation) -> bool:
    """May this operation set the value outright (dropping what appends added)?"""
    if operation.kind in ("put", "delete"):
        return True
    return operation.kind == "cas" and not (
        operation.status is STATUS_OK and operation.output is False
    )


def failure_is_explained(cas: Operation, operations: Sequence[Operation]) -> bool:
    """Must the value `cas` compared differ from its expected value, whatever unknown
    operations did? It must when an append completed before the cas was called, its suffix
    is not in the expected value, and nothing that could have replaced the value may be
    linearized between that append and the cas: the compared value then holds that suffix.
    """
    expected = cas.argument[0] if isinstance(cas.argument, tuple | list) else None
    # Only the latest return among the replacing operations called before the cas
    # returned matters: one of them overlaps [append.call_time, ...) exactly when that
    # latest return is after the append was called (one pass, not one per append).
    replacing_return_max = max(
        (
            other.return_time
            for other in operations
            if other is not cas and other.call_time < cas.return_time and replaces_the_value(other)
        ),
        default=-math.inf,
    )
    for append in operations:
        suffix = append.argument
        if (
            append.kind != "append"
            or append.status is not STATUS_OK
            or append.return_time >= cas.call_time
            or not isinstance(suffix, str)
            or not suffix
            or (isinstance(expected, str) and suffix in expected)
        ):
            continue
        if not replacing_return_max > append.call_time:
            return True
    return False


def seen_after_without(
    cas: Operation, append: Operation, gets: Sequence[Operation], replacing: Sequence[Operation]
) -> bool:
    """Could `append` (unknown, its suffix seen by no one) not have come before `cas`? It
    could not if a get called after the cas returned, with nothing able to replace the value
    between the append's call and that get: had the append come before the cas, that get
    would show its suffix, and none does."""
    for get in gets:
        if get.call_time <= cas.return_time:
            continue
        if not any(
            other.call_time < get.return_time and other.return_time > append.call_time
            for other in replacing
        ):
            return True
    return False


class KeyValueModel(RegisterModel):
    """A map of independent registers: one `RegisterModel` per key, checked one by one."""

    def partition(self, operations: Sequence[Operation]) -> list[list[Operation]]:
        # A dict keeps keys in the order they first appear, so results are deterministic
        # even for keys that cannot be sorted.
        by_key: dict[Any, list[Operation]] = {}
        for operation in operations:
            by_key.setdefault(operation.key, []).append(operation)
        return list(by_key.values())


KV_MODEL: Final = KeyValueModel()
REGISTER_MODEL: Final = RegisterModel()


class PartitionResult(msgspec.Struct, frozen=True):
    """The verdict on one independent part of a history (one key, for the KV model)."""

    key: Any
    """The key all its operations share, or None when they have several."""
    ok: bool | None
    """True: linearizable; False: not; None: the search gave up at its step budget."""
    operation_count: int
    """Operations checked: failed ones are dropped before the search."""
    steps: int
    culprit: Operation | None = None
    """When not linearizable: the operation whose return first leaves no valid order."""
    failing_prefix_operation_count: int = 0
    """Operations called up to the culprit's return: the smallest prefix that fails."""
    window: tuple[Operation, ...] = ()
    """The culprit, the operations concurrent with it, and a few that ended just before."""
    explanation: str = ""


class LinearizabilityResult(msgspec.Struct, frozen=True):
    """The verdict on a whole history."""

    ok: bool | None
    """False when any partition fails; else None when any gave up; else True."""
    partitions: tuple[PartitionResult, ...]
    explanation: str
    """One line when linearizable; otherwise the first failing partition's explanation."""
    steps: int
    """Search steps over every partition, including those spent finding failing windows."""


class _Call:
    """What the search needs of one operation. Optional operations (unknown outcomes) have
    no return time and need not be linearized."""

    __slots__ = ("argument", "call_time", "kind", "output", "return_time")

    def __init__(
        self, kind: str, argument: Any, output: Any, call_time: float, return_time: float | None
    ) -> None:
        self.kind = kind
        self.argument = argument
        self.output = output
        self.call_time = call_time
        self.return_time = return_time


class _Entry:
    """A call or return event in the search's doubly linked list."""

    __slots__ = ("call", "index", "match", "next", "previous")

    def __init__(self, index: int, call: _Call | None) -> None:
        self.index = index
        self.call = call
        """The operation, on call events; None on return events."""
        self.match: _Entry | None = None
        """On a call event: its return event, or None for an optional operation."""
        self.previous: _Entry | None = None
        self.next: _Entry | None = None


def _build_list(calls: Sequence[_Call]) -> _Entry:
    """Link every event in time order behind a head sentinel; return the head."""
    events: list[tuple[float, int, int]] = []
    for index, call in enumerate(calls):
        events.append((call.call_time, 0, index))
        if call.return_time is not None:
            events.append((call.return_time, 1, index))
    events.sort()  # calls (0) before returns (1) at equal times: touching means concurrent
    head = _Entry(-1, None)
    call_entries: dict[int, _Entry] = {}
    last = head
    for _, is_return, index in events:
        entry = _Entry(index, None if is_return else calls[index])
        if is_return:
            call_entries[index].match = entry
        else:
            call_entries[index] = entry
        entry.previous = last
        last.next = entry
        last = entry
    return head


def _unlink(entry: _Entry) -> None:
    # A lifted entry always has a predecessor: the head sentinel never moves.
    previous = entry.previous
    if previous is None:
        raise RuntimeError("linearizability search: an event lost its predecessor")
    previous.next = entry.next
    if entry.next is not None:
        entry.next.previous = previous


def _relink(entry: _Entry) -> None:
    previous = entry.previous
    if previous is None:
        raise RuntimeError("linearizability search: an event lost its predecessor")
    previous.next = entry
    if entry.next is not None:
        entry.next.previous = entry


def _lift(entry: _Entry) -> None:
    _unlink(entry)
    if entry.match is not None:
        _unlink(entry.match)


def _unlift(entry: _Entry) -> None:
    # Undo in the reverse order of `_lift`, so each entry's saved neighbours are current.
    if entry.match is not None:
        _relink(entry.match)
    _relink(entry)


class _Explored:
    """Configurations the search has already explored, to prune repeats (Lowe's cache).

    A configuration is the set of linearized operations and the model state. The set is
    split into required operations (they returned) and optional ones (unknown outcomes),
    because of a dominance: leaving an optional operation out allows everything that
    putting it in allows (it has no return that could force an order, and it may stay out
    to the end), so a configuration whose optional set contains one already explored with
    the same required set and state cannot succeed where that one failed. Without this,
    each pending unknown write doubles the configurations to explore.
    """

    def __init__(self) -> None:
        self._optional_sets: dict[tuple[int, Hashable], list[int]] = {}

    def visit(self, required: int, optional: int, state: Hashable) -> bool:
        """Record the configuration; False if it or one that dominates it was seen."""
        seen = self._optional_sets.setdefault((required, state), [])
        for previous in seen:
            if previous & ~optional == 0:
                return False
        # Keep only the smallest sets: those that contain the new one are now dominated.
        seen[:] = [previous for previous in seen if optional & ~previous != 0]
        seen.append(optional)
        return True


def _search(model: Model, calls: Sequence[_Call], steps_max: int) -> tuple[bool | None, int]:
    """Whether the calls have a linearization; None if `steps_max` steps did not tell."""
    head = _build_list(calls)
    state = model.init()
    required = 0
    optional = 0
    required_remaining = sum(1 for call in calls if call.return_time is not None)
    explored = _Explored()
    stack: list[tuple[_Entry, Hashable]] = []
    entry = head.next
    steps = 0
    while required_remaining > 0:
        steps += 1
        if steps > steps_max:
            return None, steps_max
        if entry is None:
            # A required operation's return always follows its call, so the scan meets a
            # return event, and backtracks, before it can fall off the end.
            raise RuntimeError("linearizability search ran past the last event")
        call = entry.call
        if call is None:
            if not stack:
                return False, steps
            entry, state = stack.pop()
            _unlift(entry)
            if entry.match is not None:
                required &= ~(1 << entry.index)
                required_remaining += 1
            else:
                optional &= ~(1 << entry.index)
            entry = entry.next
            continue
        accepted, new_state = model.step(state, call.kind, call.argument, call.output)
        if accepted and _follows_a_pointless_optional(model, stack, call, new_state):
            accepted = False
        if accepted:
            bit = 1 << entry.index
            is_required = entry.match is not None
            new_required = required | bit if is_required else required
            new_optional = optional if is_required else optional | bit
            if explored.visit(new_required, new_optional, new_state):
                stack.append((entry, state))
                state = new_state
                required, optional = new_required, new_optional
                required_remaining -= 1 if is_required else 0
                _lift(entry)
                entry = head.next
                continue
        entry = entry.next
    return True, steps


def _follows_a_pointless_optional(
    model: Model, stack: Sequence[tuple[_Entry, Hashable]], call: _Call, new_state: Hashable
) -> bool:
    """Whether the operation last linearized is optional and changes nothing for `call`:
    `call` reaches the same state from the state before it.

    Then linearizing `call` here is dominated by linearizing it without that optional
    operation, which the search tries (or has tried) from the configuration before: every
    operation this one could take next is open there too, since an optional operation has
    no return to close anything, and the optional one may still come later, or never. This
    turns a run of unknown blind writes (put, delete) into one choice per write instead of
    one per subset of them.
    """
    if not stack:
        return False
    last_entry, state_before = stack[-1]
    if last_entry.match is not None:
        return False
    accepted, state = model.step(state_before, call.kind, call.argument, call.output)
    return accepted and state == new_state


def _calls_until(
    model: Model, operations: Sequence[Operation], time: float, returned_ids: set[int] | None
) -> list[_Call]:
    """The history as seen at `time`, when only the operations in `returned_ids` (None: all
    completed ones) have returned: the others become optional, with an unknown output, and
    unknown read-only ones are dropped as they constrain nothing."""
    calls = []
    for operation in operations:
        if operation.call_time > time:
            continue
        returned = operation.status is OperationStatus.OK and (
            returned_ids is None or operation.operation_id in returned_ids
        )
        if returned:
            calls.append(
                _Call(
                    operation.kind,
                    operation.argument,
                    operation.output,
                    operation.call_time,
                    operation.return_time,
                )
            )
        elif not model.is_read_only(operation.kind):
            calls.append(
                _Call(operation.kind, operation.argument, UNKNOWN_OUTPUT, operation.call_time, None)
            )
    return calls


def check_linearizable(
    operations: Sequence[Operation],
    model: Model = KV_MODEL,
    time_budget_steps: int = TIME_BUDGET_STEPS_DEFAULT,
) -> LinearizabilityResult:
    """Check a history against `model`.

    `time_budget_steps` bounds the steps of each search: one per partition, then, for a
    partition that fails, one per prefix tried while narrowing the failure down (about
    log2 of its operation count). A partition that runs out of steps has ok None.
    """
    if time_budget_steps < 1:
        raise ValueError(f"time_budget_steps must be at least 1, not {time_budget_steps}")
    seen_ids: set[int] = set()
    for operation in operations:
        check_operation(operation)
        if operation.operation_id in seen_ids:
            raise HistoryError(f"operation id {operation.operation_id} appears twice")
        seen_ids.add(operation.operation_id)
    kept = [operation for operation in operations if operation.status is not OperationStatus.FAILED]
    prune = getattr(model, "without_unobservable", None)
    parts = model.partition(kept)
    if prune is not None:
        parts = [prune(part) for part in parts]
    partitions = tuple(_check_partition(model, part, time_budget_steps) for part in parts)
    steps = sum(partition.steps for partition in partitions)
    failing = [partition for partition in partitions if partition.ok is False]
    if failing:
        first = min(failing, key=_culprit_return_time)
        return LinearizabilityResult(False, partitions, first.explanation, steps)
    gave_up = [partition for partition in partitions if partition.ok is None]
    if gave_up:
        explanation = (
            f"undecided: {len(gave_up)} of {len(partitions)} partitions ran out of the budget "
            f"of {time_budget_steps} search steps, first {_describe_key(gave_up[0].key)}"
        )
        return LinearizabilityResult(None, partitions, explanation, steps)
    explanation = (
        f"linearizable: {len(kept)} operations in {len(partitions)} partitions, "
        f"{steps} search steps"
    )
    return LinearizabilityResult(True, partitions, explanation, steps)


def _culprit_return_time(partition: PartitionResult) -> float:
    return partition.culprit.return_time if partition.culprit is not None else float("inf")


def _check_partition(
    model: Model, operations: Sequence[Operation], steps_max: int
) -> PartitionResult:
    first_key = operations[0].key if operations else None
    key = first_key if all(operation.key == first_key for operation in operations) else None
    ok, steps = _search(model, _calls_until(model, operations, float("inf"), None), steps_max)
    if ok is not False:
        return PartitionResult(key, ok, len(operations), steps)
    culprit, narrowing_steps = _smallest_failing_prefix(model, operations, steps_max)
    prefix_count = sum(1 for operation in operations if operation.call_time <= culprit.return_time)
    window = _window(operations, culprit)
    return PartitionResult(
        key,
        False,
        len(operations),
        steps + narrowing_steps,
        culprit=culprit,
        failing_prefix_operation_count=prefix_count,
        window=window,
        explanation=_explain(model, key, culprit, prefix_count, window),
    )


def _smallest_failing_prefix(
    model: Model, operations: Sequence[Operation], steps_max: int
) -> tuple[Operation, int]:
    """Binary search the earliest return after which a failing history has no
    linearization; return the operation that made that return and the steps spent.

    Only a return can make a prefix fail (a new call is optional until it returns), and a
    prefix that fails stays failing as the history grows, so the search is monotone. A
    search that runs out of budget counts as not failing: the answer is always a prefix
    proven to fail, perhaps not the smallest.
    """
    returned = sorted(
        (operation for operation in operations if operation.status is OperationStatus.OK),
        key=lambda operation: (operation.return_time, operation.operation_id),
    )
    if not returned:
        raise RuntimeError("a history with no completed operation cannot fail")
    low, high = 0, len(returned) - 1
    steps_total = 0
    while low < high:
        middle = (low + high) // 2
        # Ties in return time are split by operation id, so the culprit is one operation.
        returned_ids = {operation.operation_id for operation in returned[: middle + 1]}
        calls = _calls_until(model, operations, returned[middle].return_time, returned_ids)
        ok, steps = _search(model, calls, steps_max)
        steps_total += steps
        if ok is False:
            high = middle
        else:
            low = middle + 1
    return returned[high], steps_total


def _window(operations: Sequence[Operation], culprit: Operation) -> tuple[Operation, ...]:
    concurrent = [
        operation
        for operation in operations
        if operation.call_time <= culprit.return_time and operation.return_time >= culprit.call_time
    ]
    before = sorted(
        (operation for operation in operations if operation.return_time < culprit.call_time),
        key=lambda operation: operation.return_time,
    )[-_WINDOW_CONTEXT_OPERATIONS_MAX:]
    return tuple(
        sorted(
            before + concurrent,
            key=lambda operation: (operation.call_time, operation.operation_id),
        )
    )


def _explain(
    model: Model,
    key: Any,
    culprit: Operation,
    prefix_count: int,
    window: Sequence[Operation],
) -> str:
    lines = [
        f"{_describe_key(key)} is not linearizable: its first {prefix_count} operations, up to "
        f"time {_format_time(culprit.return_time)}, have no valid order once operation "
        f"{culprit.operation_id} returns ({_describe(model, culprit)}).",
        "Operations around it:",
    ]
    for operation in window[:_WINDOW_OPERATIONS_MAX]:
        marker = "  <- culprit" if operation.operation_id == culprit.operation_id else ""
        lines.append(f"  {_describe(model, operation)}{marker}")
    if len(window) > _WINDOW_OPERATIONS_MAX:
        lines.append(f"  ... and {len(window) - _WINDOW_OPERATIONS_MAX} more")
    return "\n".join(lines)


def _describe(model: Model, operation: Operation) -> str:
    output = operation.output if operation.status is OperationStatus.OK else UNKNOWN_OUTPUT
    return (
        f"#{operation.operation_id} client {operation.client_id!r}: "
        f"{model.describe_operation(operation.kind, operation.argument, output)} "
        f"[{_format_time(operation.call_time)}, {_format_time(operation.return_time)}] "
        f"{operation.status.value}"
    )


def _describe_key(key: Any) -> str:
    return "the history" if key is None else f"key {key!r}"


def _format_time(time: float) -> str:
    if time == float("inf"):
        return "inf"
    return f"{time:g}" if isinstance(time, float) else str(time)
