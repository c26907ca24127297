"""A sequential model of the v3 KV for the linearizability checker: multi-key txns and
ranges over one map.

Why one map and no per-key split: a txn compares and writes several keys atomically and a
range reads several at one instant, so splitting by key (as `KeyValueModel` does for the
plain KV) would check each key's projection alone and accept histories where two keys are
seen in orders no single sequence explains (two ranges each seeing a different one of two
concurrent puts first). The whole map as one state is the plain Wing & Gong search, sound
by construction; the workload keeps it cheap with a few keys and a handful of clients.

Operations (all on the history key "*"):

- "txn": argument `(compares, success, failure)`, tuples as `KVClient.txn` takes them,
  restricted to what the checker models: compares `("value", key, "==", text)` and
  `("create", key, "==" | ">", 0)` (missing / present); operations `("put", key, text)`,
  `("delete", key)` and `("get", key)`. Output `(succeeded, gets)`: the branch taken and
  the value (or None) each get of it read, in order.
- "range": argument `(start, end)` (keys in [start, end)); output the `(key, value)` pairs
  in key order.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Final

from quorumlog.testing.history import HistoryError, Operation
from quorumlog.testing.linearizability import UNKNOWN_OUTPUT

State = tuple[tuple[str, str], ...]


def compare_holds(values: dict[str, str], compare: tuple[Any, ...]) -> bool:
    target, key, operator, operand = compare
    if target == "value":
        return key in values and values[key] == operand
    if target == "create":
        exists = key in values
        return exists if operator == ">" else not exists
    raise HistoryError(f"the txn model has no compare {compare!r}")


def run_txn(state: State, argument: Any) -> tuple[bool, tuple[str | None, ...], State]:
    """The branch taken, the gets' values, the state after."""
    compares, success, failure = argument
    values = dict(state)
    succeeded = all(compare_holds(values, compare) for compare in compares)
    gets: list[str | None] = []
    for operation in success if succeeded else failure:
        kind, key, *rest = operation
        if kind == "put":
            values[key] = rest[0]
        elif kind == "delete":
            values.pop(key, None)
        elif kind == "get":
            gets.append(values.get(key))
        else:
            raise HistoryError(f"the txn model has no operation {operation!r}")
    return succeeded, tuple(gets), tuple(sorted(values.items()))


class MultiKeyModel:
    """The whole map as one state (see the module docstring)."""

    kinds: Final = frozenset({"txn", "range"})

    def init(self) -> Hashable:
        return ()

    def step(self, state: Hashable, kind: str, argument: Any, output: Any) -> tuple[bool, Hashable]:
        current: State = state  # type: ignore[assignment]
        if kind == "range":
            start, end = argument
            seen = tuple((key, value) for key, value in current if start <= key < end)
            return output is UNKNOWN_OUTPUT or output == seen, current
        if kind == "txn":
            succeeded, gets, after = run_txn(current, argument)
            return output is UNKNOWN_OUTPUT or output == (succeeded, gets), after
        raise HistoryError(f"the txn model has no operation kind {kind!r}")

    def partition(self, operations: Sequence[Operation]) -> list[list[Operation]]:
        return [list(operations)] if operations else []

    def is_read_only(self, kind: str) -> bool:
        return kind == "range"

    def describe_operation(self, kind: str, argument: Any, output: Any) -> str:
        shown = "?" if output is UNKNOWN_OUTPUT else repr(output)
        return f"{kind}({argument!r}) -> {shown}"


TXN_MODEL: Final = MultiKeyModel()

__all__ = ["TXN_MODEL", "MultiKeyModel", "run_txn"]
