"""Carrying consumer-group offsets over from the previous release.

The previous release kept each group's committed offsets in the "kv" group, under
`__offsets/<group>/<topic>/<partition>` (the value: the offset as decimal text). They now
live in the coordinator's state machine, so a cluster upgraded in place would lose them
and its consumers (auto_offset_reset "latest") would skip records. Once per leadership
the coordinator leader therefore:

1. reads every `__offsets/` key linearizably through the "kv" group's leader (the internal
   KV path, `InternalKeys`). Not from this node's own copy of the KV: the coordinator's
   leader need not lead "kv", and a follower's copy may lag what was committed, while a
   ReadIndex barrier is only offered to the leader (`GroupHandle.linearizable_read`);
2. proposes `ImportOffsets` per group through the coordinator's log; applying it sets an
   offset only where the group has none, so a commit made since the upgrade wins and a
   second import changes nothing;
3. once the imports are applied, deletes the keys it imported, each only if it still
   holds the value that was read (compare-and-delete): a value some old-release client
   wrote in between is not destroyed unread. A crash between 2 and 3 is harmless: the
   next leader imports again, which changes nothing.

Until that is done the leader answers client requests with GroupCoordinatorLoadingError
(Kafka's COORDINATOR_LOAD_IN_PROGRESS), which clients retry: a consumer that joined in
between would otherwise find no offset, start at "latest" and commit that, and its commit
would then win over the imported one. Once the keys are gone a new leader's step 1 is one
scan of an empty range.

Keys that do not parse (a partition or offset that is not a non-negative decimal) are
logged and left where they are; so are those of a group the coordinator refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from quorumlog.auth.credentials import CredentialsSource
from quorumlog.errors import QuorumLogError, UnavailableError
from quorumlog.kv.client import KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.client import call_on_loop
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.handle import GroupHandle
from quorumlog.runtime.resources import Scheduler
from quorumlog.stream.group_model import (
    GroupEntry,
    GroupResult,
    ImportOffsets,
    PartitionOffset,
    encode_entry,
)
from quorumlog.tls.config import TLSConfig

log = logging.getLogger("quorumlog.node")

PREVIOUS_OFFSETS_PREFIX = "__offsets/"
IMPORTS_PER_ENTRY_MAX = 100
"""Groups per log entry of imports, so a cluster with many groups never makes one huge
entry."""
RETRY_SECONDS_DEFAULT = 1.0
"""How long a leader waits after a failed import (no "kv" leader yet, say) to try again."""
KV_TIMEOUT_SECONDS_DEFAULT = 5.0

ResultType = TypeVar("ResultType")
KeyValues = list[tuple[str, str]]


class PreviousOffsets(Protocol):
    """Where the previous release kept offsets; outcomes settle on the group's scheduler."""

    def read(self) -> Completion[KeyValues]:
        """Every `__offsets/` key and its value, read linearizably."""
        ...

    def delete(self, items: KeyValues) -> Completion[None]:
        """Delete each key that still holds the value given with it."""
        ...


def parse_previous_offsets(items: KeyValues) -> tuple[dict[str, list[PartitionOffset]], KeyValues]:
    """The offsets by group (topics and partitions sorted), and the items that do not parse.
    A key is `__offsets/<group>/<topic>/<partition>`: a group name has no "/", a topic
    name may."""
    offsets: dict[str, list[PartitionOffset]] = {}
    malformed: KeyValues = []
    for key, value in items:
        group = group_of(key)
        topic_and_partition = key.removeprefix(PREVIOUS_OFFSETS_PREFIX).partition("/")[2]
        topic, _, partition = topic_and_partition.rpartition("/")
        named = key.startswith(PREVIOUS_OFFSETS_PREFIX) and bool(group) and bool(topic)
        if named and is_decimal(partition) and is_decimal(value.strip()):
            item = PartitionOffset(topic, int(partition), int(value.strip()))
            offsets.setdefault(group, []).append(item)
        else:
            malformed.append((key, value))
    for group_offsets in offsets.values():
        group_offsets.sort(key=lambda item: (item.topic, item.partition))
    return dict(sorted(offsets.items())), malformed


def is_decimal(text: str) -> bool:
    """Plain ASCII digits (Python's isdecimal alone takes other scripts' digits too)."""
    return text.isascii() and text.isdecimal()


def group_of(key: str) -> str:
    return key.removeprefix(PREVIOUS_OFFSETS_PREFIX).partition("/")[0]


class OffsetsImport:
    """The import, once per leadership of the coordinator group (see the module docstring).
    `check()` is called on the coordinator leader's periodic check."""

    def __init__(
        self,
        group: GroupHandle,
        previous: PreviousOffsets,
        retry_seconds: float = RETRY_SECONDS_DEFAULT,
    ) -> None:
        self.group = group
        self.previous = previous
        self.retry_seconds = retry_seconds
        self.leadership = 0
        """Bumped whenever this node is seen not leading: outcomes of an attempt made in
        an earlier leadership count for nothing in a later one."""
        self.done = False
        """The import finished in the current leadership."""
        self.attempting: int | None = None
        """The leadership whose attempt is under way, if any."""
        self.retry_at_seconds = 0.0

    @property
    def loading(self) -> bool:
        """Whether the leader must still hold client requests back."""
        return self.group.is_leader and not self.done

    def check(self) -> None:
        if not self.group.is_leader:
            if self.done or self.attempting is not None:
                self.leadership += 1
                self.attempting = None
            self.done = False
            return
        if self.done or self.attempting == self.leadership:
            return
        if self.group.scheduler.monotonic_seconds() < self.retry_at_seconds:
            return
        self.attempting = self.leadership
        leadership = self.leadership
        try:
            reading = self.previous.read()
        except QuorumLogError as error:
            self.failed(leadership, error)
            return
        reading.add_done_callback(lambda done: self.read(leadership, done))

    def read(self, leadership: int, done: Completion[KeyValues]) -> None:
        error = done.exception()
        if error is not None:
            self.failed(leadership, error)
            return
        items = done.result()
        offsets, malformed = parse_previous_offsets(items)
        for key, value in malformed:
            log.warning(
                "previous release's offset %r = %r does not parse; left as it is", key, value
            )
        if not offsets:
            self.finished(leadership)
            return
        commands = [ImportOffsets(group, group_offsets) for group, group_offsets in offsets.items()]
        unparsed = set(malformed)
        # Deleted as read (not rebuilt from the offsets): "07" or " 7" must match to go.
        well_formed = [item for item in items if item not in unparsed]
        self.propose(leadership, commands, 0, [], well_formed)

    def propose(
        self,
        leadership: int,
        commands: list[ImportOffsets],
        start: int,
        imported: list[ImportOffsets],
        well_formed: KeyValues,
    ) -> None:
        """Propose the imports from `start` on, one entry after another; then delete the
        keys of those the coordinator applied."""
        if start >= len(commands):
            groups = {command.group for command in imported}
            self.delete(leadership, [i for i in well_formed if group_of(i[0]) in groups])
            return
        chunk = commands[start : start + IMPORTS_PER_ENTRY_MAX]
        entry = GroupEntry(self.group.scheduler.wall_time_ms(), [list(chunk)])
        try:
            proposal = self.group.propose(encode_entry(entry))
        except QuorumLogError as error:
            self.failed(leadership, error)
            return

        def applied(done: Completion[Any]) -> None:
            error = done.exception()
            if error is not None:
                self.failed(leadership, error)
                return
            [results] = done.result()
            imported.extend(accepted(chunk, results))
            self.propose(leadership, commands, start + len(chunk), imported, well_formed)

        proposal.add_done_callback(applied)

    def delete(self, leadership: int, items: KeyValues) -> None:
        """Delete the keys imported, each only if it still holds the value read."""
        try:
            deleting = self.previous.delete(items)
        except QuorumLogError as error:
            self.failed(leadership, error)
            return

        def deleted(done: Completion[None]) -> None:
            error = done.exception()
            if error is not None:
                self.failed(leadership, error)
                return
            log.info(
                "group coordinator: carried over %d offsets from the previous release",
                len(items),
            )
            self.finished(leadership)

        deleting.add_done_callback(deleted)

    def finished(self, leadership: int) -> None:
        if leadership != self.leadership:
            return
        self.attempting = None
        self.done = True

    def failed(self, leadership: int, error: BaseException) -> None:
        if leadership != self.leadership:
            return
        log.info(
            "group coordinator: offsets of the previous release not carried over yet: %s", error
        )
        self.attempting = None
        self.retry_at_seconds = self.group.scheduler.monotonic_seconds() + self.retry_seconds


def accepted(chunk: list[ImportOffsets], results: list[GroupResult]) -> list[ImportOffsets]:
    """The imports the coordinator applied; a refused one is logged (its keys stay)."""
    kept = []
    for command, result in zip(chunk, results, strict=True):
        if result.ok:
            kept.append(command)
        else:
            log.warning(
                "group coordinator: offsets of group %r not carried over: %s",
                command.group,
                result.error,
            )
    return kept


class KVPreviousOffsets:
    """`PreviousOffsets` through the "kv" group's leader: a KVClient with this node's own
    credentials (internal keys are root's), its blocking calls on a thread of its own, the
    outcomes settled on the event loop. A client is made for each call, from the
    endpoints known then (peers' addresses are learnt after start)."""

    def __init__(
        self,
        scheduler: Scheduler,
        endpoints: Callable[[], list[str]],
        cluster_id: str,
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
        timeout_seconds: float = KV_TIMEOUT_SECONDS_DEFAULT,
    ) -> None:
        self.scheduler = scheduler
        self.endpoints = endpoints
        self.cluster_id = cluster_id
        self.credentials = credentials
        self.tls = tls
        self.timeout_seconds = timeout_seconds
        self.loop = asyncio.get_running_loop()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="offsets-import")

    def read(self) -> Completion[KeyValues]:
        return self.call(lambda keys: keys.scan_prefix(PREVIOUS_OFFSETS_PREFIX))

    def delete(self, items: KeyValues) -> Completion[None]:
        def delete_each(keys: InternalKeys) -> None:
            for key, value in items:
                keys.cas(key, value, None)

        return self.call(delete_each)

    def call(self, job: Callable[[InternalKeys], ResultType]) -> Completion[ResultType]:
        completion: Completion[ResultType] = Completion(self.scheduler)
        endpoints = self.endpoints()

        def run() -> ResultType:
            client = KVClient(
                endpoints,
                timeout=self.timeout_seconds,
                cluster_id=self.cluster_id,
                credentials=self.credentials,
                tls=self.tls,
            )
            try:
                return job(InternalKeys(client))
            finally:
                client.close()

        def report(finished: Future[ResultType]) -> None:
            if finished.cancelled():
                return
            error = finished.exception()
            if error is None:
                call_on_loop(self.loop, completion.set_result, finished.result())
            elif isinstance(error, QuorumLogError | OSError):
                typed = UnavailableError(f"the previous release's offsets: {error}")
                call_on_loop(self.loop, completion.set_exception, typed)
            else:
                call_on_loop(self.loop, raise_error, error)

        self.executor.submit(run).add_done_callback(report)
        return completion

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def raise_error(error: BaseException) -> None:
    """On the loop: an unexpected error (a bug) is not turned into a retry."""
    raise error


__all__ = [
    "PREVIOUS_OFFSETS_PREFIX",
    "KVPreviousOffsets",
    "OffsetsImport",
    "PreviousOffsets",
    "parse_previous_offsets",
]
