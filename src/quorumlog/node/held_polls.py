"""Polls held until there is something to answer: the waiting list, each poll's timer and
the wake-up after an apply, shared by the KV's watches (`node.kv_watches`) and the sharded
KV's (`node.shard_watches`). Each says what an answer is (`answer`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from quorumlog.runtime.handle import GroupHandle
from quorumlog.runtime.resources import Timer

WAIT_MS_MAX = 30_000
"""The longest a poll is held, whatever it asks."""


class HeldPoll:
    """One poll that may be held; `timer` ends its wait."""

    __slots__ = ("timer",)

    def __init__(self) -> None:
        self.timer: Timer | None = None


PollType = TypeVar("PollType", bound=HeldPoll)


class HeldPolls(ABC, Generic[PollType]):
    """The polls waiting on one node; at most `waiting_max` (past it a poll is answered
    at once, with whatever there is)."""

    def __init__(self, group: GroupHandle, waiting_max: int) -> None:
        self.group = group
        self.waiting_max = waiting_max
        self.waiting: list[PollType] = []
        self.wake_scheduled = False

    @abstractmethod
    def answer(self, poll: PollType, final: bool) -> bool:
        """Reply if there is something to say (or `final`); whether it replied."""

    def answer_or_hold(self, poll: PollType, wait_ms: int) -> None:
        final = wait_ms <= 0 or len(self.waiting) >= self.waiting_max
        if self.answer(poll, final=final):
            return
        wait_seconds = min(wait_ms, WAIT_MS_MAX) / 1000
        poll.timer = self.group.scheduler.call_later(wait_seconds, lambda: self.expire(poll))
        self.waiting.append(poll)

    def expire(self, poll: PollType) -> None:
        if poll in self.waiting:
            self.waiting.remove(poll)
            self.answer(poll, final=True)

    def changed(self) -> None:
        """An entry was applied: wake the polls after this apply returns."""
        if self.waiting and not self.wake_scheduled:
            self.wake_scheduled = True
            self.group.scheduler.call_soon(self.wake)

    def wake(self) -> None:
        self.wake_scheduled = False
        still: list[PollType] = []
        for poll in self.waiting:
            if self.answer(poll, final=False):
                if poll.timer is not None:
                    poll.timer.cancel()
            else:
                still.append(poll)
        self.waiting = still


__all__ = ["WAIT_MS_MAX", "HeldPoll", "HeldPolls"]
