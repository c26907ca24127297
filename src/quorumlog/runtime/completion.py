"""`Completion`: the outcome of a request to a group, without asyncio.

The host resolves completions (a proposal applied, a read barrier passed, a failure) and
services attach callbacks to them. Callbacks never run inside the call that resolves the
completion: they are handed to the scheduler, so a callback that proposes again cannot
re-enter the host in the middle of its apply loop (asyncio's futures behave the same way).
Code that lives on asyncio awaits one through `runtime.asyncio_host.wait_for_completion`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Generic, TypeVar

from quorumlog.raft.invariants import require
from quorumlog.runtime.resources import Scheduler

ResultType = TypeVar("ResultType")


class Completion(Generic[ResultType]):
    __slots__ = ("callbacks", "error", "finished", "scheduler", "value")

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.finished = False
        self.value: ResultType | None = None
        self.error: BaseException | None = None
        self.callbacks: list[Callable[[Completion[ResultType]], None]] = []

    @classmethod
    def failed(cls, scheduler: Scheduler, error: BaseException) -> Completion[ResultType]:
        completion: Completion[ResultType] = cls(scheduler)
        completion.set_exception(error)
        return completion

    def done(self) -> bool:
        return self.finished

    def result(self) -> ResultType:
        """The value; raises the failure instead if it failed."""
        require(self.finished, "result() of a completion that is not done")
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]

    def exception(self) -> BaseException | None:
        require(self.finished, "exception() of a completion that is not done")
        return self.error

    def set_result(self, value: ResultType) -> None:
        if not self.finished:
            self.value = value
            self.finish()

    def set_exception(self, error: BaseException) -> None:
        if not self.finished:
            self.error = error
            self.finish()

    def add_done_callback(self, callback: Callable[[Completion[ResultType]], None]) -> None:
        """Call `callback(self)` once done (soon, through the scheduler; never inline)."""
        if self.finished:
            self.scheduler.call_soon(functools.partial(callback, self))
        else:
            self.callbacks.append(callback)

    def finish(self) -> None:
        self.finished = True
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            self.scheduler.call_soon(functools.partial(callback, self))
