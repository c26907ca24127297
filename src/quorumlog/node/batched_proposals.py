"""Group commit for a service whose log entries carry client command batches.

The shard controller and the HA controller both gather the batches that arrive in one turn
of the loop into one log entry (stamped once with the leader's clock, so every replica
decides time-dependent rules from the log alone) and answer each batch with its own results
once the entry is applied. `BatchedProposals` is that mechanism, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.handle import GroupHandle

Replier = Callable[[wire.Frame], None]
BatchType = TypeVar("BatchType")


class BatchedProposals(Generic[BatchType]):
    def __init__(
        self,
        group: GroupHandle,
        make_entry: Callable[[int, list[BatchType]], bytes],
        answer: Callable[[Replier, int, Any], None],
        reject: Callable[[Replier, int, BaseException], None],
    ) -> None:
        """`make_entry(timestamp_ms, batches)`: the encoded log entry; `answer(reply,
        request_id, results)`: one batch's results as the machine returned them;
        `reject(reply, request_id, error)`: the proposal failed."""
        self.group = group
        self.make_entry = make_entry
        self.answer = answer
        self.reject = reject
        self.pending: list[tuple[int, BatchType, Replier]] = []
        self.flush_scheduled = False

    def add(self, request_id: int, batch: BatchType, reply: Replier) -> None:
        self.pending.append((request_id, batch, reply))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.group.scheduler.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        pending, self.pending = self.pending, []
        if not pending:
            return
        timestamp_ms = self.group.scheduler.wall_time_ms()
        try:
            completion = self.group.propose(
                self.make_entry(timestamp_ms, [batch for _, batch, _ in pending])
            )
        except QuorumLogError as error:
            for request_id, _, reply in pending:
                self.reject(reply, request_id, error)
            return

        def settle(done: Completion[Any]) -> None:
            error = done.exception()
            if error is not None:
                for request_id, _, reply in pending:
                    self.reject(reply, request_id, error)
                return
            for (request_id, _, reply), results in zip(pending, done.result(), strict=True):
                self.answer(reply, request_id, results)

        completion.add_done_callback(settle)
