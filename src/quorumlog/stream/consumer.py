"""Consumer: read committed records, alone or as a member of a consumer group.

    from quorumlog import Consumer

    with Consumer(["127.0.0.1:2379"], group="billing") as consumer:
        consumer.subscribe(["events"])          # or subscribe(pattern="events-.*")
        while True:
            for record in consumer.poll(1.0):  # every assigned partition, long-polled
                ...                             # offsets auto-committed every 5 s

    with Consumer(["127.0.0.1:2379"]) as consumer:  # no group: read by offset
        records = consumer.read("events", 0, offset=0, max_records=1000)

Groups (Kafka's protocol, see `stream.group_model`): members of a group share the
partitions of the topics they subscribe to; the coordinator assigns them (assignor
"cooperative-sticky" by default, or "range") and moves the partitions of a member that
leaves (`close`) at once, of one that stops heartbeating after `session_timeout_ms`.
Heartbeats run on the client's I/O thread; `poll` picks up a new assignment, calling
`on_revoke` with the partitions lost and `on_assign` with those gained (in the caller's
thread). Revocation comes first, as in Kafka: with auto-commit the positions in the lost
partitions are committed, then `on_revoke` runs (a `commit()` there still covers them),
and only then does the group give them to their new owner, which so starts at that
commit. A partition newly assigned starts at the group's committed offset, else where
`auto_offset_reset` says ("latest" by default, as in Kafka).

Commits carry the member's generation: a commit from a member the group removed, or made
before a rebalance took the partition away, raises `CommitFailedError` and changes nothing,
so no committed offset goes back because of a member that lost its partitions. Delivery is
at least once: a partition taken from a member that stopped (its session expired) is read
again from its last commit by the new owner.

A member whose application does not call `poll` for `max_poll_interval_ms` (default five
minutes, as Kafka's) leaves the group, even though its heartbeats would keep it in: its
partitions (and any it was handing over) go to the other members at once, not after a
session timeout, and nothing more of its positions is committed (`commit` raises
`CommitFailedError`, as Kafka's does). The next `poll` gives those partitions up as lost
(`on_revoke` runs, as Kafka's default `onPartitionsLost`; positions are forgotten, not
committed) and joins again as a new member. Time inside `poll` does not count; raise the
interval if processing what one poll returns may take longer.

`read` asks one replica of the partition (the leader by default). An offset deleted by
retention raises OffsetOutOfRangeError naming the first offset kept.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from quorumlog.errors import ClientError, CommitFailedError
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT
from quorumlog.stream.assignors import ASSIGNOR_DEFAULT, TopicPartition
from quorumlog.stream.client_common import (
    BlockingClient,
    OffsetOutOfRangeError,
    leader_status,
)
from quorumlog.stream.fetching import (
    FETCH_BYTES_MAX_DEFAULT,
    READ_RECORDS_MAX_DEFAULT,
    FetchedRecord,
    FetchedRecordBatch,
    batch_decoder,
    check_read,
    decode_records,
    fetch,
)
from quorumlog.stream.group_client import CoordinatorLink
from quorumlog.stream.group_model import NO_GENERATION, SESSION_TIMEOUT_MS_DEFAULT, Refusal
from quorumlog.stream.membership import (
    HEARTBEAT_INTERVAL_SECONDS_DEFAULT,
    Generation,
    Membership,
)
from quorumlog.stream.offset_lookup import offset_for_time
from quorumlog.stream.poll_interval import MAX_POLL_INTERVAL_MS_DEFAULT, check_max_poll_interval_ms
from quorumlog.stream.records import Record
from quorumlog.tls.config import TLSConfig

log = logging.getLogger("quorumlog.consumer")

OFFSET_RESETS = ("earliest", "latest")
AUTO_OFFSET_RESET_DEFAULT = "latest"
AUTO_COMMIT_INTERVAL_SECONDS_DEFAULT = 5.0
"""Kafka's `auto.commit.interval.ms`."""
FETCH_MAX_WAIT_SECONDS_DEFAULT = 0.5
"""Kafka's `fetch.max.wait.ms`: how long a node holds a fetch at the end of a partition."""
POLL_PAUSE_SECONDS = 0.01
"""Between fetch rounds that came back empty at once (partitions whose storage does not
hold fetches: ledger and HA topics), so an empty poll does not spin."""

PartitionsCallback = Callable[[set[TopicPartition]], None]


class Consumer(BlockingClient):
    """Reads records; with `group`, also joins the group (`subscribe`) and commits.

    Thread-safe for `read` and the offset calls; `poll`, `commit` and the assignment calls
    keep positions, so one thread polls a consumer (as in Kafka)."""

    def __init__(
        self,
        endpoints: list[str],
        group: str | None = None,
        auto_offset_reset: str = AUTO_OFFSET_RESET_DEFAULT,
        fetch_bytes_max: int = FETCH_BYTES_MAX_DEFAULT,
        timeout: float = 10.0,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        attempt_timeout_seconds: float | None = None,
        read_from_followers: bool = False,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_seconds: float = AUTO_COMMIT_INTERVAL_SECONDS_DEFAULT,
        session_timeout_ms: int = SESSION_TIMEOUT_MS_DEFAULT,
        heartbeat_interval_seconds: float = HEARTBEAT_INTERVAL_SECONDS_DEFAULT,
        partition_assignment_strategy: str = ASSIGNOR_DEFAULT,
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
        fetch_max_wait_seconds: float = FETCH_MAX_WAIT_SECONDS_DEFAULT,
        max_poll_interval_ms: int = MAX_POLL_INTERVAL_MS_DEFAULT,
    ) -> None:
        """`read_from_followers`: let any replica answer reads (spreads load; a follower may
        trail the leader by a moment). By default the leader answers, as in Kafka, so a
        read sees every record a producer had acknowledged. The group settings take
        Kafka's names and defaults; `enable_auto_commit` commits the positions `poll`
        reached every `auto_commit_interval_seconds` (and at `close`);
        `max_poll_interval_ms` is the longest the application may go without calling
        `poll` before the member leaves the group (module docstring)."""
        self.read_from_followers = read_from_followers
        if auto_offset_reset not in OFFSET_RESETS:
            raise ValueError(
                f"auto_offset_reset is one of {', '.join(OFFSET_RESETS)}, not {auto_offset_reset!r}"
            )
        if fetch_bytes_max < 1:
            raise ValueError(f"fetch_bytes_max must be positive, got {fetch_bytes_max}")
        if group is not None and (not group or "/" in group):
            raise ValueError(f"a group name is not empty and has no '/', got {group!r}")
        if auto_commit_interval_seconds <= 0 or fetch_max_wait_seconds < 0:
            raise ValueError("auto_commit_interval_seconds > 0 and fetch_max_wait_seconds >= 0")
        check_max_poll_interval_ms(max_poll_interval_ms)
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self.fetch_bytes_max = fetch_bytes_max
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_seconds = auto_commit_interval_seconds
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.positions: dict[TopicPartition, int] = {}
        """Where poll() reads next in each partition it has read."""
        self.next_poll_start = 0
        self.paused_partitions: set[TopicPartition] = set()
        self.manual_assignment: frozenset[TopicPartition] | None = None
        self.applied = Generation(NO_GENERATION, frozenset())
        """The assignment `poll` works on (the membership's newest, once picked up)."""
        self.revoking = False
        """`revoke` is running (its commits and `on_revoke` see the partitions still)."""
        self.last_commit_seconds = time.monotonic()
        super().__init__(
            endpoints,
            timeout=timeout,
            cluster_id=cluster_id,
            attempt_timeout_seconds=attempt_timeout_seconds,
            thread_name="quorumlog-consumer",
            user=user,
            password=password,
            tls=tls,
        )
        # A held fetch must end before its attempt times out, or the node's late answer
        # would count as a lost connection.
        attempt_seconds = self.transport.kv.attempt_timeout_seconds
        self.fetch_max_wait_seconds = min(fetch_max_wait_seconds, attempt_seconds / 2)
        self.link = CoordinatorLink(self.transport, self.transport.kv.selector.endpoints)
        self.membership: Membership | None = None
        if group is not None:
            self.membership = Membership(
                self.link,
                self.transport,
                group,
                self.transport.kv.session.client_id,
                session_timeout_ms,
                heartbeat_interval_seconds,
                partition_assignment_strategy,
                max_poll_interval_ms,
            )
        self.subscribed = False

    # --- reads --------------------------------------------------------------------------

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = READ_RECORDS_MAX_DEFAULT,
    ) -> list[Record]:
        """Up to `max_records` committed records from `offset` on; [] at the end.

        OffsetOutOfRangeError below the first retained offset or past the end."""
        check_read(offset, max_records)
        result = self.run(
            fetch(
                self.transport,
                topic,
                partition,
                offset,
                max_records,
                self.fetch_bytes_max,
                leader_only=not self.read_from_followers,
            )
        )
        return decode_records(topic, partition, offset, result, max_records)

    def begin_offset(self, topic: str, partition: int) -> int:
        """The first offset still retained."""
        return self.run(leader_status(self.transport, topic, partition)).begin_offset

    def end_offset(self, topic: str, partition: int) -> int:
        """One past the last committed offset (the high watermark), as the leader knows it."""
        return self.run(leader_status(self.transport, topic, partition)).end_offset

    def partitions(self, topic: str) -> list[int]:
        descriptor = self.run(self.transport.topic(topic))
        return list(range(len(descriptor.replicas)))

    def offsets_for_times(
        self, timestamps_ms: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int | None]:
        """For each partition, the first offset whose record's timestamp is at or after the
        given one (None if no record is that late), as Kafka's offsetsForTimes. A binary
        search over the retained records, which assumes timestamps do not go down within a
        partition (true of the leader's stamps; producers that set their own must keep
        them in order for the answer to be exact)."""
        return {
            key: self.run(
                offset_for_time(self.transport, key[0], key[1], timestamp_ms, self.fetch_bytes_max)
            )
            for key, timestamp_ms in timestamps_ms.items()
        }

    # --- subscription and assignment ----------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None) -> None:
        """Join the group reading `topics`, or every topic whose whole name matches the
        regular expression `pattern` (topics created later are picked up within
        seconds). Returns once the group answered the join."""
        membership = self.require_membership()
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe to topics or to a pattern (one of the two)")
        compiled = re.compile(pattern) if pattern is not None else None
        self.manual_assignment = None
        self.give_up_lost_partitions()
        self.run(membership.subscribe(list(topics or []), compiled))
        self.subscribed = True
        self.sync_assignment()

    def unsubscribe(self) -> None:
        """Leave the group (committing first if auto-commit is on); partitions go at once."""
        if self.membership is None or not self.subscribed:
            return
        self.commit_on_leaving()
        self.run(self.membership.leave())
        self.subscribed = False
        self.sync_assignment()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read these partitions without group membership (commits, if a group is set,
        are taken only while the group has no members, as in Kafka)."""
        if self.subscribed:
            raise ClientError("this consumer is subscribed; unsubscribe before assign")
        self.manual_assignment = frozenset(partitions)
        self.sync_assignment()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now."""
        self.sync_assignment()
        return set(self.applied.assignment)

    def sync_assignment(self) -> None:
        """Take up the newest assignment: forget revoked partitions, position gained ones,
        and tell the callbacks."""
        if self.manual_assignment is not None:
            latest = Generation(NO_GENERATION, self.manual_assignment)
        elif self.membership is not None and self.subscribed:
            latest = self.membership.latest()
            if latest.left_group:
                return  # lost, not revoked: the next poll gives them up, committing nothing
        else:
            latest = Generation(NO_GENERATION, frozenset())
        if self.revoking or (
            latest.generation == self.applied.generation
            and latest.assignment == self.applied.assignment
        ):
            return  # nothing new, or a commit made while revoking asked
        revoked = set(self.applied.assignment - latest.assignment)
        gained = set(latest.assignment - self.applied.assignment)
        try:
            if revoked:
                self.revoke(latest.generation, revoked)
        finally:
            # Given up even if on_revoke raised (its error goes to the caller of poll).
            self.applied = latest
            if self.membership is not None and self.subscribed:
                self.membership.hold(latest.assignment)
                if revoked:
                    # Tell the group at once: the new owners wait for this member's word.
                    self.io.call_soon(self.membership.wake.set)
        if gained:
            self.position_partitions(gained)
            if self.on_assign is not None:
                self.on_assign(gained)

    def revoke(self, generation: int, revoked: set[TopicPartition]) -> None:
        """Give partitions up as Kafka does, before their new owner may read them: commit
        where poll stands in them (with auto-commit), call `on_revoke`, then forget them.
        The group lets this member commit them until it says it let go (the next join,
        after this returns), so commits here use the new generation and still name them."""
        self.revoking = True
        self.applied = Generation(generation, self.applied.assignment)
        try:
            if self.enable_auto_commit and self.group is not None and self.subscribed:
                offsets = {key: self.positions[key] for key in revoked if key in self.positions}
                try:
                    self.commit_offsets(offsets)
                except ClientError as error:
                    # Given up all the same (as Kafka does): the new owner reads on from
                    # the commit before, so records are read again, none lost.
                    log.warning(
                        "group %s: commit of revoked partitions failed: %s", self.group, error
                    )
            if self.on_revoke is not None:
                self.on_revoke(revoked)
        finally:
            self.revoking = False
            for key in revoked:
                self.positions.pop(key, None)
                self.paused_partitions.discard(key)

    def give_up_lost_partitions(self) -> None:
        """If the member left the group for the poll interval: forget its partitions and
        their positions without committing (another member may read them already, from
        the last commit), and tell `on_revoke` (Kafka's `onPartitionsLost`, whose default
        is `onPartitionsRevoked`)."""
        if self.membership is None or not self.subscribed:
            return
        if not self.membership.left_for_poll_interval():
            return
        lost = set(self.applied.assignment)
        self.applied = Generation(NO_GENERATION, frozenset())
        self.membership.hold(frozenset())
        for key in lost:
            self.positions.pop(key, None)
            self.paused_partitions.discard(key)
        if lost and self.on_revoke is not None:
            self.on_revoke(lost)

    def rejoin_if_left(self) -> None:
        """After leaving for the poll interval, the next poll joins again (a new member)."""
        membership = self.membership
        if membership is None or not self.subscribed:
            return
        if not membership.left_for_poll_interval():
            return
        try:
            self.give_up_lost_partitions()
        finally:
            # Even if on_revoke raised (its error goes to the caller of poll).
            self.run(membership.rejoin())

    def position_partitions(self, keys: set[TopicPartition]) -> None:
        committed = self.run(self.link.committed_offsets(self.group)) if self.group else {}
        for key in sorted(keys):
            if key not in self.positions:
                found = committed.get(key)
                self.positions[key] = found if found is not None else self.reset_position(key)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop returning records of these partitions from poll (membership goes on)."""
        self.paused_partitions.update(partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self.paused_partitions.difference_update(partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_partitions)

    # --- positions ----------------------------------------------------------------------

    def position(self, topic: str, partition: int) -> int:
        """Where poll() reads next: its position, else the committed offset, else the
        earliest or latest offset (`auto_offset_reset`)."""
        key = (topic, partition)
        if key not in self.positions:
            self.position_partitions({key})
        return self.positions[key]

    def seek(self, topic: str, partition: int, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        self.positions[(topic, partition)] = offset

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Move to the first retained offset (of the partitions given, else all assigned)."""
        for topic, partition in self.chosen(partitions):
            self.positions[(topic, partition)] = self.begin_offset(topic, partition)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        for topic, partition in self.chosen(partitions):
            self.positions[(topic, partition)] = self.end_offset(topic, partition)

    def chosen(self, partitions: Iterable[TopicPartition] | None) -> list[TopicPartition]:
        if partitions is not None:
            return sorted(partitions)
        self.sync_assignment()
        return sorted(self.applied.assignment)

    def reset_position(self, key: TopicPartition) -> int:
        topic, partition = key
        if self.auto_offset_reset == "earliest":
            return self.begin_offset(topic, partition)
        return self.end_offset(topic, partition)

    # --- commits ------------------------------------------------------------------------

    def commit(
        self, topic: str | None = None, partition: int | None = None, offset: int | None = None
    ) -> None:
        """Commit where poll() stands in every assigned partition (no arguments), or
        `offset` (the next one to read) for one partition. CommitFailedError if the group
        fenced the commit (see the module docstring)."""
        if topic is None:
            self.commit_offsets(self.current_positions())
            return
        if partition is None or offset is None:
            raise ValueError("commit(topic, partition, offset), or commit() for all positions")
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        self.commit_offsets({(topic, partition): offset})

    def commit_positions(self, topic: str | None = None) -> None:
        """Commit where poll() stands in every partition it has read (of `topic`, if given)."""
        positions = self.current_positions()
        self.commit_offsets({k: v for k, v in positions.items() if topic in (None, k[0])})

    def commit_async(self, callback: Callable[[Future[None]], None] | None = None) -> Future[None]:
        """Commit the positions without waiting; the future holds the outcome (a
        CommitFailedError is not retried, as Kafka's commitAsync does not)."""
        group = self.require_group()
        offsets = self.current_positions()
        try:
            member_id, generation = self.member_and_generation()
        except CommitFailedError as error:
            failed: Future[None] = Future()
            failed.set_exception(error)
            if callback is not None:
                failed.add_done_callback(callback)
            return failed
        future = self.io.submit(self.link.commit(group, offsets, member_id, generation))
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset of the partition, or None if it never committed."""
        group = self.require_group()
        return self.run(self.link.committed_offsets(group)).get((topic, partition))

    def current_positions(self) -> dict[TopicPartition, int]:
        self.sync_assignment()
        if self.subscribed or self.manual_assignment is not None:
            owned = self.applied.assignment
            return {key: self.positions[key] for key in owned if key in self.positions}
        return dict(self.positions)

    def member_and_generation(self) -> tuple[str, int]:
        """CommitFailedError if the member left the group for the poll interval (the
        coordinator would refuse it too, unless the leave was lost: refused here first)."""
        if self.membership is not None and self.subscribed:
            if self.membership.left_for_poll_interval():
                raise CommitFailedError(
                    Refusal.UNKNOWN_MEMBER.value,
                    f"member {self.membership.member_id!r} left group {self.group!r}: poll() "
                    "was not called within max_poll_interval_ms, so its partitions went to "
                    "other members (the next poll() joins again)",
                    self.group,
                )
            return self.membership.member_id, self.applied.generation
        return "", NO_GENERATION

    def commit_offsets(self, offsets: dict[TopicPartition, int]) -> None:
        group = self.require_group()
        if not offsets:
            return
        member_id, generation = self.member_and_generation()
        try:
            self.run(self.link.commit(group, offsets, member_id, generation))
        except CommitFailedError as error:
            if error.code != Refusal.ILLEGAL_GENERATION.value or self.membership is None:
                if self.membership is not None:
                    self.io.call_soon(self.membership.wake.set)  # rejoin without delay
                raise
            # Still a member, only behind: learn the generation and commit what we kept.
            self.run(self.membership.heartbeat())
            self.sync_assignment()
            kept = {key: value for key, value in offsets.items() if key in self.applied.assignment}
            if kept:
                self.run(self.link.commit(group, kept, member_id, self.applied.generation))
            if len(kept) != len(offsets):
                raise
        self.last_commit_seconds = time.monotonic()

    def maybe_auto_commit(self) -> None:
        if not (self.enable_auto_commit and self.group is not None and self.subscribed):
            return
        if time.monotonic() - self.last_commit_seconds < self.auto_commit_interval_seconds:
            return
        try:
            self.commit_offsets(self.current_positions())
        except CommitFailedError as error:
            # The partitions moved on; the next poll reads what this member owns now.
            log.warning("group %s: auto-commit refused: %s", self.group, error)
            self.last_commit_seconds = time.monotonic()

    def commit_on_leaving(self) -> None:
        left = self.membership is not None and self.membership.left_for_poll_interval()
        if self.enable_auto_commit and self.subscribed and not left:
            try:
                self.commit_offsets(self.current_positions())
            except ClientError as error:
                log.warning("group %s: commit on leaving failed: %s", self.group, error)

    def require_group(self) -> str:
        if self.group is None:
            raise ClientError("this consumer has no group: pass group=... to Consumer")
        return self.group

    def require_membership(self) -> Membership:
        if self.membership is None:
            raise ClientError("this consumer has no group: pass group=... to Consumer")
        return self.membership

    # --- poll ---------------------------------------------------------------------------

    def poll(
        self,
        topic: str | float | None = None,
        partitions: list[int] | None = None,
        max_records: int = READ_RECORDS_MAX_DEFAULT,
        timeout_seconds: float | None = None,
    ) -> list[Record]:
        """Up to `max_records` new records, waiting up to `timeout_seconds` for some ([] if
        none came); positions move past what is returned.

        `poll(1.0)` reads the assigned partitions (after `subscribe` or `assign`);
        `poll("topic", partitions)` reads a topic's partitions (default: all) by itself.
        A member that left its group for `max_poll_interval_ms` joins again first."""
        check_read(0, max_records)
        if self.membership is None:
            return self.poll_records(topic, partitions, max_records, timeout_seconds)
        # Time inside poll does not count against max_poll_interval_ms.
        self.membership.poll_timer.poll_started()
        try:
            self.rejoin_if_left()
            return self.poll_records(topic, partitions, max_records, timeout_seconds)
        finally:
            self.membership.poll_timer.poll_ended()

    def poll_records(
        self,
        topic: str | float | None,
        partitions: list[int] | None,
        max_records: int,
        timeout_seconds: float | None,
    ) -> list[Record]:
        if isinstance(topic, str):
            chosen = self.partitions(topic) if partitions is None else list(partitions)
            keys = [(topic, partition) for partition in chosen]
            for key in keys:
                self.position(*key)
            return self.poll_partitions(lambda: keys, max_records, timeout_seconds or 0.0)
        wait_seconds = float(topic) if topic is not None else (timeout_seconds or 0.0)
        if not self.subscribed and self.manual_assignment is None:
            raise ClientError("subscribe(...) or assign(...) before poll(timeout)")
        return self.poll_partitions(self.assigned_active, max_records, wait_seconds)

    def assigned_active(self) -> list[TopicPartition]:
        # Also each round: the leave may have crossed the start of this poll.
        self.rejoin_if_left()
        self.maybe_auto_commit()
        self.sync_assignment()
        return sorted(self.applied.assignment - self.paused_partitions)

    def poll_partitions(
        self,
        active: Callable[[], list[TopicPartition]],
        max_records: int,
        timeout_seconds: float,
    ) -> list[Record]:
        deadline = time.monotonic() + max(timeout_seconds, 0.0)
        while True:
            keys = active()
            remaining = deadline - time.monotonic()
            if not keys:
                if remaining <= 0:
                    return []
                if self.membership is not None and self.subscribed:
                    self.membership.wait_for_change(self.applied.generation, remaining)
                    continue
                return []
            wait_ms = int(min(max(remaining, 0.0), self.fetch_max_wait_seconds) * 1000)
            records = self.run(self.fetch_round(keys, max_records, wait_ms))
            if records or time.monotonic() >= deadline:
                return records

    async def fetch_round(
        self, keys: list[TopicPartition], max_records: int, wait_ms: int
    ) -> list[Record]:
        """One fetch per partition at once, each held by its node up to `wait_ms`; the
        records of those that answer first (the rest are let go)."""
        # Rotate the starting partition so one busy partition cannot starve the others.
        start = self.next_poll_start % len(keys)
        self.next_poll_start += 1
        ordered = keys[start:] + keys[:start]
        started = asyncio.get_running_loop().time()
        tasks = {
            asyncio.ensure_future(self.fetch_one(key, max_records, wait_ms)): key for key in ordered
        }
        records: list[Record] = []
        errors: list[BaseException] = []
        pending = set(tasks)
        try:
            while pending and not records:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: ordered.index(tasks[t])):
                    error = task.exception()
                    if error is not None:
                        errors.append(error)
                        continue
                    found = task.result()[: max_records - len(records)]
                    if found:
                        self.positions[tasks[task]] = found[-1].offset + 1
                        records.extend(found)
        finally:
            for task in pending:
                task.cancel()
        if not records and errors and len(errors) == len(tasks):
            raise errors[0]
        if not records and asyncio.get_running_loop().time() - started < wait_ms / 2000:
            await asyncio.sleep(POLL_PAUSE_SECONDS)  # nobody held the fetch: do not spin
        return records

    async def fetch_one(self, key: TopicPartition, max_records: int, wait_ms: int) -> list[Record]:
        topic, partition = key
        position = self.positions[key]
        try:
            result = await fetch(
                self.transport,
                topic,
                partition,
                position,
                max_records,
                self.fetch_bytes_max,
                leader_only=not self.read_from_followers,
                max_wait_ms=wait_ms,
            )
        except OffsetOutOfRangeError as error:
            if position >= error.begin_offset:
                raise
            # Retention deleted our position: start again where `auto_offset_reset` says.
            early = self.auto_offset_reset == "earliest"
            self.positions[key] = error.begin_offset if early else error.end_offset
            return []
        return decode_records(topic, partition, position, result, max_records)

    # --- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """Commit (with auto-commit), leave the group at once, and stop."""
        if not self.closed and self.membership is not None and self.subscribed:
            try:
                self.unsubscribe()
            except ClientError as error:
                log.warning("group %s: leaving failed: %s", self.group, error)
        super().close()


__all__ = [
    "AUTO_OFFSET_RESET_DEFAULT",
    "Consumer",
    "FetchedRecord",
    "FetchedRecordBatch",
    "batch_decoder",
    "decode_records",
    "fetch",
]
