"""A consumer's membership in its group: the join, the heartbeats, and the assignment the
coordinator last gave it.

Heartbeats run on the client's I/O loop (so a consumer busy between polls keeps its
membership, as Kafka's heartbeat thread does); each answer holds the group's generation
and this member's partitions. The user's thread picks the newest answer up in `poll`
(`Membership.latest`), so the `on_revoke`/`on_assign` callbacks run there, never on the
I/O thread. The consumer says what it still reads (`hold`) once it has revoked what it
lost, and every join carries that: a partition taken from this member reaches its new
owner only after that (`group_model` docstring).

A member whose application stops calling `poll` for `max_poll_interval_ms` leaves the
group from the I/O loop (Kafka's poll timeout, `poll_interval`): its heartbeats stop, its
partitions go to the others at once, its commits are refused, and the next `poll` joins
again as a new member (`rejoin`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
import uuid

from quorumlog.errors import ClientError, GroupCoordinatorRefusedError
from quorumlog.stream.assignors import ASSIGNORS, TopicPartition
from quorumlog.stream.client_common import StreamTransport
from quorumlog.stream.group_client import CoordinatorLink, refusal_error
from quorumlog.stream.group_model import (
    NO_GENERATION,
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    GroupResult,
    JoinGroup,
    LeaveGroup,
)
from quorumlog.stream.poll_interval import MAX_POLL_INTERVAL_MS_DEFAULT, Clock, PollTimer

log = logging.getLogger("quorumlog.consumer")

HEARTBEAT_INTERVAL_SECONDS_DEFAULT = 3.0
"""Kafka's `heartbeat.interval.ms`; keep it well under the session timeout (a third)."""
REBALANCE_HEARTBEAT_SECONDS = 0.1
"""How soon a member heartbeats again while the group is rebalancing (a member is giving
partitions up): the new owners learn them in a tenth of a second, not a whole interval."""
TOPICS_REFRESH_SECONDS = 5.0
"""How often a pattern subscription looks for new topics (Kafka's metadata.max.age is 5
minutes; topics here are few and the list is one request)."""


class Generation:
    """One answer of the coordinator: the group's generation and this member's share.
    `left_group`: the member left because the application did not poll in time; what it
    was assigned is lost (see the module docstring)."""

    def __init__(
        self,
        generation: int,
        assignment: frozenset[TopicPartition],
        left_group: bool = False,
    ) -> None:
        self.generation = generation
        self.assignment = assignment
        self.left_group = left_group


LEFT_FOR_POLL_INTERVAL = Generation(NO_GENERATION, frozenset(), left_group=True)


class Membership:
    """Lives on the I/O loop (everything but `latest`/`wait_for_change`, which any thread
    may call)."""

    def __init__(
        self,
        link: CoordinatorLink,
        transport: StreamTransport,
        group: str,
        client_id: str,
        session_timeout_ms: int,
        heartbeat_interval_seconds: float,
        assignor: str,
        max_poll_interval_ms: int = MAX_POLL_INTERVAL_MS_DEFAULT,
        clock: Clock = time.monotonic,
    ) -> None:
        """`clock`: monotonic seconds, read for the poll interval (tests pass a virtual
        one)."""
        if not SESSION_TIMEOUT_MS_MIN <= session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
            raise ValueError(
                f"session_timeout_ms is {SESSION_TIMEOUT_MS_MIN} to {SESSION_TIMEOUT_MS_MAX}, "
                f"got {session_timeout_ms}"
            )
        if heartbeat_interval_seconds <= 0:
            raise ValueError(
                f"heartbeat_interval_seconds must be positive, got {heartbeat_interval_seconds}"
            )
        if assignor not in ASSIGNORS:
            raise ValueError(f"the assignor is one of {', '.join(ASSIGNORS)}, not {assignor!r}")
        self.link = link
        self.transport = transport
        self.group = group
        self.client_id = client_id
        self.member_id = new_member_id(client_id)
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_seconds = heartbeat_interval_seconds
        self.assignor = assignor
        self.topics: list[str] = []
        self.pattern: re.Pattern[str] | None = None
        self.topics_refreshed_seconds = float("-inf")
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.current = Generation(NO_GENERATION, frozenset())
        self.failure: GroupCoordinatorRefusedError | None = None
        """A refusal of the join that retrying cannot cure (a bad argument): poll raises it."""
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.leaving = False
        self.owned: list[TopicPartition] = []
        """What the consumer still reads (`hold`): sent with every join, so the group
        knows when partitions taken from this member are free for their new owners."""
        self.rebalancing = False
        self.poll_timer = PollTimer(max_poll_interval_ms, clock)
        self.heartbeat_lock = asyncio.Lock()
        """One join in flight at a time (the loop's, or a `subscribe`'s while the loop
        runs): answers are taken in the order they were asked, so an answer computed
        before another is never taken after it (the generation would go back)."""

    # --- any thread ---------------------------------------------------------------------

    def latest(self) -> Generation:
        with self.lock:
            if self.failure is not None:
                raise self.failure
            return self.current

    def left_for_poll_interval(self) -> bool:
        """The member left because the application did not poll in time (it has not
        joined again yet)."""
        with self.lock:
            return self.current.left_group

    def hold(self, assignment: frozenset[TopicPartition]) -> None:
        """The consumer now reads `assignment` (it finished revoking anything else)."""
        with self.lock:
            self.owned = sorted(assignment)

    def wait_for_change(self, generation: int, timeout_seconds: float) -> None:
        """Block up to `timeout_seconds` until an answer with another generation came."""
        with self.changed:
            self.changed.wait_for(
                lambda: self.current.generation != generation or self.failure is not None,
                timeout=max(timeout_seconds, 0.0),
            )

    # --- the I/O loop -------------------------------------------------------------------

    async def subscribe(self, topics: list[str], pattern: re.Pattern[str] | None) -> None:
        """Join with this subscription (the answer is awaited), then heartbeat."""
        self.topics = sorted(set(topics))
        self.pattern = pattern
        self.leaving = False
        self.topics_refreshed_seconds = float("-inf")
        if self.current.left_group:
            self.become_new_member()
        self.poll_timer.restart()
        await self.heartbeat()
        self.start_heartbeats()

    async def rejoin(self) -> None:
        """Join again, as a new member, after leaving for the poll interval (Kafka gives the
        member a new id too: the old one may still be in the group if the leave was lost,
        until its session times out)."""
        self.become_new_member()
        self.poll_timer.restart()
        try:
            await self.heartbeat()
        finally:
            # Heartbeats go on even if this join failed: the loop joins again.
            self.start_heartbeats()

    def become_new_member(self) -> None:
        self.member_id = new_member_id(self.client_id)
        with self.changed:
            self.owned = []
            self.rebalancing = False
            self.current = Generation(NO_GENERATION, frozenset())
            self.changed.notify_all()

    def start_heartbeats(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self.heartbeat_forever())

    async def heartbeat_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.leaving:
            # Sleeping is the schedule here; `wake` cuts it short (a commit was fenced).
            # Not asyncio.wait_for: on 3.11 it can swallow a cancellation that arrives as
            # the event is set, and `leave` would then wait out a whole interval.
            interval_seconds = heartbeat_delay_seconds(
                self.heartbeat_interval_seconds, self.rebalancing
            )
            # Wake when the poll interval runs out, not a heartbeat later.
            interval_seconds = max(min(interval_seconds, self.poll_timer.seconds_left()), 0.0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_seconds):
                    await self.wake.wait()
            self.wake.clear()
            if self.leaving:
                return
            if self.poll_timer.overdue():
                await self.leave_for_poll_interval()
                if self.current.left_group:
                    return  # `rejoin` starts the heartbeats again
                continue  # the application polled (and joined again) while the leave went
            started = loop.time()
            try:
                await self.heartbeat()
            except ClientError as error:
                log.info("group %s: heartbeat failed (%s); trying again", self.group, error)
            if loop.time() - started > self.session_timeout_ms / 1000:
                log.warning("group %s: a heartbeat took longer than the session", self.group)

    async def heartbeat(self) -> None:
        async with self.heartbeat_lock:
            await self.join_once()

    async def join_once(self) -> None:
        if self.current.left_group:
            return  # only `rejoin` (the next poll) or `subscribe` joins again
        member_id = self.member_id
        topics = await self.subscribed_topics()
        owned, owned_generation = self.owned_now()
        command = JoinGroup(
            self.group,
            member_id,
            self.client_id,
            topics,
            self.session_timeout_ms,
            self.assignor,
            owned=owned,
            owned_generation=owned_generation,
        )
        result = await self.link.send(f"heartbeat of group {self.group}", command)
        with self.changed:
            if self.current.left_group or member_id != self.member_id:
                return  # an answer that crossed the leave: it no longer speaks for us
            self.rebalancing = result.ok and result.rebalancing
            if not result.ok:
                self.failure = refusal_error(result, self.group)
            else:
                taken = answer_taken(self.current, result)
                if taken is not None:
                    self.current = taken
            self.changed.notify_all()

    def owned_now(self) -> tuple[list[TopicPartition], int]:
        """What the consumer reads now, and the newest generation it knew then."""
        with self.lock:
            return list(self.owned), self.current.generation

    async def subscribed_topics(self) -> list[str]:
        if self.pattern is None:
            return self.topics
        now = asyncio.get_running_loop().time()
        if now - self.topics_refreshed_seconds >= TOPICS_REFRESH_SECONDS:
            self.topics_refreshed_seconds = now
            known = await self.transport.refresh_topics()
            pattern = self.pattern
            self.topics = sorted(name for name in known if pattern.fullmatch(name))
        return self.topics

    async def leave_for_poll_interval(self) -> None:
        """The application did not poll in time: leave now, so the group gives this
        member's partitions (and any it was handing over) to the others at once. Marked
        before the leave is sent, so no commit of this member goes out meanwhile. If the
        leave is lost, the heartbeats have stopped all the same: the session times out."""
        log.warning(
            "group %s: member %s leaves the group: poll() was not called within "
            "max_poll_interval_ms (%d ms), so its partitions go to other members; the "
            "next poll() joins again",
            self.group,
            self.member_id,
            round(self.poll_timer.max_poll_interval_seconds * 1000),
        )
        with self.changed:
            self.current = LEFT_FOR_POLL_INTERVAL
            self.rebalancing = False
            self.changed.notify_all()
        with contextlib.suppress(ClientError):
            await self.link.send(
                f"leave group {self.group}", LeaveGroup(self.group, self.member_id)
            )

    async def leave(self) -> None:
        """Stop heartbeating and leave at once (the partitions go to others now, not after
        a session timeout)."""
        self.leaving = True
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        if not self.topics and self.pattern is None:
            return  # never subscribed
        # Sent even after a leave for the poll interval: that leave may have been cut
        # short (this cancelled it), and leaving twice changes nothing.
        with contextlib.suppress(ClientError):
            await self.link.send(
                f"leave group {self.group}", LeaveGroup(self.group, self.member_id)
            )
        with self.changed:
            self.current = Generation(NO_GENERATION, frozenset())
            self.changed.notify_all()


# --- the member's decisions, without I/O (the simulator's consumers take them too) ----------


def heartbeat_delay_seconds(heartbeat_interval_seconds: float, rebalancing: bool) -> float:
    """How long a member waits before its next heartbeat: sooner while its group
    rebalances, so the new owners of what it gives up learn them soon."""
    if rebalancing:
        return min(heartbeat_interval_seconds, REBALANCE_HEARTBEAT_SECONDS)
    return heartbeat_interval_seconds


def answer_taken(current: Generation, result: GroupResult) -> Generation | None:
    """What a member knows after the coordinator accepted its join (`result.ok`): the
    answer's generation and assignment if they differ from `current`, else None (nothing
    changed)."""
    if result.generation != current.generation or (
        frozenset(result.assignment) != current.assignment
    ):
        return Generation(result.generation, frozenset(result.assignment))
    return None


def new_member_id(client_id: str) -> str:
    return f"{client_id}-{uuid.uuid4().hex[:12]}"


__all__ = [
    "HEARTBEAT_INTERVAL_SECONDS_DEFAULT",
    "LEFT_FOR_POLL_INTERVAL",
    "Generation",
    "Membership",
    "answer_taken",
    "heartbeat_delay_seconds",
]
