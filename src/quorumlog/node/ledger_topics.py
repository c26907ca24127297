"""Serves ledger-backed topics on a node (issue 11, "Managed ledgers: topics stored in
ledgers"): each partition a managed ledger (ledger/managed.py), written by one owner node.

- Which nodes may own a partition: its descriptor's replicas. Which one does: the lease in
  the metadata group (ledger/ownership.py), renewed every `renew_seconds` by the owner,
  taken over by another candidate once stale. Safety comes from fencing, not the lease: a
  new owner's open recovers the last ledger, so an old owner that still believes it owns
  the partition gets LedgerFencedError (NotPartitionOwnerError) at its next append.
- The owner runs one `ManagedLedger` per owned partition, all on one `LedgerDriver` on
  the node's event loop, over `AsyncioBookieLinks`; metadata calls (the ledger store, the
  managed ledger records, the leases) block, so they run on this service's own executor
  threads, never on the loop.
- Produce and fetch are served by the owner only (a fetch too: only the owner knows the
  end of the open ledger); any other replica answers NOT_LEADER naming the owner, so the
  Producer's and Consumer's usual leader-hint retry finds it. PartitionStatus: the owner
  answers with its offsets; another replica names the owner and the offsets its copy of
  the ledger list shows.
- A clean stop closes the managed ledgers (so the next owner needs no recovery) and hands
  each lease to the next candidate, which then takes it without waiting for it to go stale.
- Whatever a deleted topic leaves behind (a delete cut short, a ledger created and never
  listed) is removed by the sweep (node/ledger_sweep.py), which the "kv" group's leader
  runs every `sweep_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from quorumlog.auth.credentials import CredentialsSource
from quorumlog.codec import wire
from quorumlog.errors import (
    LedgerClosedError,
    LedgerError,
    LedgerMetadataFormatError,
    LedgerPendingFullError,
    NotPartitionOwnerError,
    QuorumLogError,
)
from quorumlog.kv.client import KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.client import BookieDirectory, ThreadedMetadataAccess, call_on_loop
from quorumlog.ledger.driver import LedgerDriver
from quorumlog.ledger.links import AsyncioBookieLinks
from quorumlog.ledger.managed import ManagedLedger, ManagedLedgerConfig
from quorumlog.ledger.managed_format import CompressedRecords, managed_ledger_key
from quorumlog.ledger.managed_kv import KVManagedLedgerStore, compare_and_set
from quorumlog.ledger.metadata_kv import KeyValueStore, KVMetadataStore
from quorumlog.ledger.ownership import (
    LeaseMove,
    OwnerLease,
    decode_lease,
    encode_lease,
    next_move,
    owner_key,
    taken_lease,
)
from quorumlog.node.ledger_sweep import (
    SWEEP_INTERVAL_SECONDS_DEFAULT,
    SweptGarbage,
    sweep_deleted_topics,
)
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.group import AsyncioScheduler, completion_future
from quorumlog.runtime.transport import Replier
from quorumlog.stream.partition import (
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProduceOutcome,
)
from quorumlog.stream.topics import group_id
from quorumlog.tls.config import TLSConfig

log = logging.getLogger("quorumlog.ledger_topics")

ResultType = TypeVar("ResultType")

METADATA_THREADS = 4
"""Threads for blocking metadata calls: the driver's, the managed ledgers' and the leases'
(each KV client serves one call at a time, so they do not queue behind each other)."""
DELETE_ATTEMPTS = 5
"""Tries at deleting a deleted partition's ledgers and keys, spaced by growing waits."""


class LedgerTopicSettings(msgspec.Struct, frozen=True, kw_only=True):
    renew_seconds: float = 1.0
    """How often an owner renews its leases (and every candidate looks at them)."""
    stale_seconds: float = 3.0
    """A lease unchanged this long (on the observer's clock) may be taken over."""
    rollover_records_max: int = 50_000
    """Records per ledger before the owner rolls over to a new one."""
    metadata_timeout_seconds: float = 10.0
    close_wait_seconds: float = 2.0
    """How long a clean stop waits for its managed ledgers to close."""
    sweep_seconds: float = SWEEP_INTERVAL_SECONDS_DEFAULT
    """How often the sweeping node removes what deleted topics left (node/ledger_sweep.py)."""

    def validate(self) -> None:
        if self.renew_seconds <= 0 or self.stale_seconds <= self.renew_seconds:
            raise ValueError("need 0 < renew_seconds < stale_seconds")
        if self.rollover_records_max < 1:
            raise ValueError("rollover_records_max must be >= 1")
        if not self.sweep_seconds > 0:
            raise ValueError("sweep_seconds must be > 0")


@dataclass
class LedgerPartition:
    """One partition of a ledger topic that this node is a candidate owner of."""

    descriptor: wire.TopicDescriptor
    partition: int
    name: str
    """The managed ledger's name: the topic's incarnation and the partition, so a topic
    deleted and created again never meets the old one's ledgers or lease."""
    observed_value: str | None = None
    observed_at: float = 0.0
    held_value: str | None = None
    """The lease value this node last wrote: set while it holds the lease."""
    lease_busy: bool = False
    managed: ManagedLedger | None = None
    ready: bool = False
    """The managed ledger finished opening (its offsets are known)."""


class ExecutorCalls:
    """`BlockingCalls` on an executor: outcomes settle on the event loop. A typed error or
    an OSError fails the completion; anything else is raised on the loop (fail-stop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor) -> None:
        self.loop = loop
        self.executor = executor

    def run(self, job: Callable[[], ResultType], completion: Completion[ResultType]) -> None:
        def report(finished: Future[ResultType]) -> None:
            if finished.cancelled():
                return
            error = finished.exception()
            if error is None:
                call_on_loop(self.loop, completion.set_result, finished.result())
            elif isinstance(error, QuorumLogError):
                call_on_loop(self.loop, completion.set_exception, error)
            elif isinstance(error, OSError):
                typed = LedgerError(f"metadata call failed: {error}")
                call_on_loop(self.loop, completion.set_exception, typed)
            else:
                call_on_loop(self.loop, raise_error, error)

        self.executor.submit(job).add_done_callback(report)


def raise_error(error: BaseException) -> None:
    raise error


class LedgerParts:
    """What every owned partition shares: the driver, its links, the metadata clients."""

    def __init__(
        self,
        node_id: str,
        cluster_id: str,
        endpoints: list[str],
        timeout_seconds: float,
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.executor = ThreadPoolExecutor(METADATA_THREADS, thread_name_prefix="ledger-topics")
        self.ledger_kv = KVClient(
            endpoints,
            timeout=timeout_seconds,
            cluster_id=cluster_id,
            credentials=credentials,
            tls=tls,
        )
        self.lease_kv = KVClient(
            endpoints,
            timeout=timeout_seconds,
            cluster_id=cluster_id,
            credentials=credentials,
            tls=tls,
        )
        # Ledger lists and owners' leases are internal keys ("__managed/", "__owners/").
        self.ledger_keys = InternalKeys(self.ledger_kv)
        self.lease_keys = InternalKeys(self.lease_kv)
        self.metadata = KVMetadataStore(self.ledger_kv)
        self.directory = BookieDirectory(self.metadata)
        self.links = AsyncioBookieLinks(
            self.loop,
            self.directory.resolve,
            self.executor,
            cluster_id=cluster_id,
            client_id=f"node-{node_id}-ledgers",
            tls=tls,
        )
        self.scheduler = AsyncioScheduler(self.loop)
        self.driver = LedgerDriver(
            self.scheduler,
            self.links,
            ThreadedMetadataAccess(self.metadata, self.loop, self.executor, timeout_seconds),
        )
        self.links.attach(self.driver)
        self.calls = ExecutorCalls(self.loop, self.executor)
        self.store = KVManagedLedgerStore(
            self.scheduler, self.ledger_kv, self.metadata, self.calls, self.drop_ledger
        )

    def drop_ledger(self, bookie_id: str, ledger_id: int) -> None:
        def answered(future: asyncio.Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:
                log.info("bookie %s did not drop ledger %d: %s", bookie_id, ledger_id, future)

        self.links.drop_ledger(bookie_id, ledger_id).add_done_callback(answered)

    def call(self, job: Callable[[], ResultType]) -> Completion[ResultType]:
        completion: Completion[ResultType] = Completion(self.scheduler)
        self.calls.run(job, completion)
        return completion

    async def close(self) -> None:
        self.driver.close()
        self.links.close()
        for client in (self.ledger_kv, self.lease_kv):
            # Not on `executor`: a call stuck there (no metadata leader while the cluster
            # stops) would hold the close behind it for the client's whole timeout.
            with contextlib.suppress(QuorumLogError, OSError):
                await asyncio.to_thread(client.close)
        self.executor.shutdown(wait=False, cancel_futures=True)


class LedgerTopicService:
    def __init__(
        self,
        node_id: str,
        cluster_id: str,
        settings: LedgerTopicSettings,
        read_local: Callable[[str], str | None],
        metadata_endpoints: Callable[[], list[str]],
        address_of: Callable[[str | None], str | None],
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
        sweeps: Callable[[], bool] | None = None,
        on_swept: Callable[[int], None] | None = None,
    ) -> None:
        """`read_local`: a key of this node's copy of the metadata group (possibly behind;
        leases are only watched through it, every change is a CAS through a client);
        `credentials`: the node's own identity when auth is on; `sweeps`: whether this node
        is the one to sweep deleted topics' leftovers now (the "kv" leader); `on_swept`:
        told how many ledgers each sweep deleted."""
        settings.validate()
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.settings = settings
        self.read_local = read_local
        self.metadata_endpoints = metadata_endpoints
        self.address_of = address_of
        self.credentials = credentials
        self.tls = tls
        self.partitions: dict[tuple[str, int], LedgerPartition] = {}
        self.parts: LedgerParts | None = None
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self.deletions: set[asyncio.Task[None]] = set()
        self.sweeps = sweeps
        self.on_swept = on_swept
        self.sweep_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start sweeping (see `sweep_forever`); hosting starts with the first topic."""
        if self.sweeps is not None and self.sweep_task is None and not self.stopping:
            self.sweep_task = asyncio.create_task(self.sweep_forever())

    # --- hosting ---------------------------------------------------------------------------

    def host(self, descriptor: wire.TopicDescriptor) -> None:
        """Become a candidate owner of the partitions this node is a replica of."""
        for partition, replicas in enumerate(descriptor.replicas):
            if self.node_id not in replicas:
                continue
            name = group_id(descriptor, partition)
            self.partitions[(descriptor.name, partition)] = LedgerPartition(
                descriptor, partition, name
            )
            log.info("candidate owner of ledger topic %s partition %d", descriptor.name, partition)
        if self.task is None and not self.stopping:
            self.task = asyncio.create_task(self.keep_ownership_forever())

    def drop(self, descriptor: wire.TopicDescriptor) -> None:
        """The topic was deleted: the owner of each partition closes it, then deletes its
        ledgers (dropped on their bookies), its ledger list and its lease."""
        for partition in range(len(descriptor.replicas)):
            part = self.partitions.get((descriptor.name, partition))
            if part is None or part.descriptor.created_ms != descriptor.created_ms:
                continue
            del self.partitions[(descriptor.name, partition)]
            closing = self.let_go(part)
            if part.held_value is not None and self.parts is not None:
                self.delete_partition(self.parts, part, closing)

    def delete_partition(
        self, parts: LedgerParts, part: LedgerPartition, closing: Completion[None] | None
    ) -> None:
        """Delete in the background, again after a failure (a metadata leader change, a
        lease renewal that was in flight): what is left behind would never be collected,
        since no node hosts the deleted topic any more."""
        task = asyncio.create_task(self.delete_until_done(parts, part.name, closing))
        self.deletions.add(task)
        task.add_done_callback(self.deletions.discard)

    async def delete_until_done(
        self, parts: LedgerParts, name: str, closing: Completion[None] | None
    ) -> None:
        if closing is not None:
            with contextlib.suppress(QuorumLogError):
                await completion_future(closing)
        for attempt in range(1, DELETE_ATTEMPTS + 1):
            try:
                record = await completion_future(parts.store.read_record(name))
                for ledger in [] if record is None else record.ledgers:
                    await completion_future(parts.store.delete_ledger(ledger.ledger_id))
                forget = functools.partial(forget_keys, parts.ledger_keys, name, self.node_id)
                await completion_future(parts.call(forget))
                return
            except QuorumLogError as error:
                if attempt == DELETE_ATTEMPTS or self.stopping:
                    log.warning("%s: deleted topic's ledgers left behind: %s", name, error)
                    return
                log.info("%s: deleting (attempt %d) failed, again soon: %s", name, attempt, error)
                await asyncio.sleep(self.settings.renew_seconds * attempt)

    def serves(self, topic: str, partition: int) -> LedgerPartition | None:
        return self.partitions.get((topic, partition))

    def ensure_parts(self) -> LedgerParts:
        if self.parts is None:
            self.parts = LedgerParts(
                self.node_id,
                self.cluster_id,
                self.metadata_endpoints(),
                self.settings.metadata_timeout_seconds,
                self.credentials,
                self.tls,
            )
        return self.parts

    # --- ownership -------------------------------------------------------------------------

    async def keep_ownership_forever(self) -> None:
        while not self.stopping:
            for part in list(self.partitions.values()):
                self.look_at_lease(part)
            await asyncio.sleep(self.settings.renew_seconds)

    def look_at_lease(self, part: LedgerPartition) -> None:
        now = asyncio.get_running_loop().time()
        value = self.read_local(owner_key(part.name))
        if value != part.observed_value or part.observed_at == 0.0:
            part.observed_value = value
            part.observed_at = now
        if part.managed is not None and part.managed.failure is not None:
            log.info("%s: managed ledger failed: %s", part.name, part.managed.failure)
            self.let_go(part, close=False)
        if part.lease_busy:
            return
        try:
            lease = decode_lease(value)
        except LedgerMetadataFormatError as error:
            log.warning("%s: %s", part.name, error)
            return
        move = next_move(
            self.node_id,
            list(part.descriptor.replicas[part.partition]),
            lease,
            part.held_value is not None,
            now - part.observed_at,
            self.settings.stale_seconds,
            self.settings.renew_seconds,
        )
        if move is LeaseMove.RENEW:
            held = decode_lease(part.held_value)
            if held is not None:
                self.write_lease(part, part.held_value, held.renewed())
        elif move is LeaseMove.TAKE:
            self.write_lease(part, value, taken_lease(self.node_id, lease))

    def write_lease(self, part: LedgerPartition, expected: str | None, lease: OwnerLease) -> None:
        parts = self.ensure_parts()
        new_value = encode_lease(lease)
        key = owner_key(part.name)
        part.lease_busy = True

        def written(done: Completion[bool]) -> None:
            part.lease_busy = False
            error = done.exception()
            if error is not None:
                # Unknown or not done: the next look decides again.
                log.info("%s: lease write failed: %s", part.name, error)
                return
            if done.result():
                taking = part.held_value is None
                part.held_value = new_value
                if taking:
                    log.info("%s: owner now (epoch %d)", part.name, lease.epoch)
                self.ensure_managed(part)
            elif part.held_value is not None:
                log.info("%s: lost the ownership lease", part.name)
                part.held_value = None
                self.let_go(part)

        parts.call(
            lambda: compare_and_set(parts.lease_keys, key, expected, new_value)
        ).add_done_callback(written)

    def ensure_managed(self, part: LedgerPartition) -> None:
        if part.managed is not None or self.stopping or part not in self.partitions.values():
            return
        parts = self.ensure_parts()
        managed = ManagedLedger(
            part.name, self.node_id, parts.driver, parts.store, self.managed_config(part)
        )
        part.managed = managed
        part.ready = False

        def opened(done: Completion[None]) -> None:
            if part.managed is not managed:
                return
            error = done.exception()
            if error is None:
                part.ready = True
                log.info(
                    "%s: open at offsets [%d, %d)",
                    part.name,
                    managed.start_offset,
                    managed.end_offset,
                )
            else:
                # Still the lease holder: the next renewal builds a new one and opens again.
                log.info("%s: open failed: %s", part.name, error)
                part.managed = None

        managed.open().add_done_callback(opened)

    def managed_config(self, part: LedgerPartition) -> ManagedLedgerConfig:
        settings = part.descriptor.settings
        return ManagedLedgerConfig(
            ensemble_size=settings.ensemble,
            write_quorum_size=settings.write_quorum,
            ack_quorum_size=settings.ack_quorum,
            rollover_records_max=self.settings.rollover_records_max,
            retention_bytes=settings.retention_bytes,
            retention_ms=settings.retention_ms,
        )

    def let_go(self, part: LedgerPartition, close: bool = True) -> Completion[None] | None:
        """Stop using the partition's managed ledger (closing it, unless it failed)."""
        managed = part.managed
        part.managed = None
        part.ready = False
        if managed is None or managed.failure is not None or not close:
            return None
        closing = managed.close()

        def closed(done: Completion[None]) -> None:
            if done.exception() is not None:
                log.info("%s: close failed: %s", part.name, done.exception())

        closing.add_done_callback(closed)
        return closing

    # --- retention -------------------------------------------------------------------------

    def trim(self) -> None:
        """Retention: each owned partition with a bound drops its expired whole ledgers."""
        for part in self.partitions.values():
            settings = part.descriptor.settings
            managed = part.managed
            if managed is None or not part.ready:
                continue
            if settings.retention_bytes < 0 and settings.retention_ms < 0:
                continue
            managed.trim().add_done_callback(functools.partial(trimmed, part.name))

    # --- sweeping --------------------------------------------------------------------------

    async def sweep_forever(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.settings.sweep_seconds)
            if self.sweeps is not None and self.sweeps():
                await self.sweep()

    async def sweep(self) -> SweptGarbage | None:
        """One sweep (node/ledger_sweep.py), then each deleted ledger's bookies are asked
        to drop it; None when the metadata group did not answer (the next one tries)."""
        parts = self.ensure_parts()
        job = functools.partial(sweep_deleted_topics, parts.ledger_kv, parts.metadata)
        try:
            swept = await completion_future(parts.call(job))
        except QuorumLogError as error:
            log.info("sweep of deleted topics failed, next time: %s", error)
            return None
        if swept.ledgers and self.on_swept is not None:
            self.on_swept(len(swept.ledgers))
        for ledger in swept.ledgers:
            bookies = {bookie for ensemble in ledger.ensembles.values() for bookie in ensemble}
            for bookie_id in sorted(bookies):
                parts.drop_ledger(bookie_id, ledger.ledger_id)
        return swept

    # --- requests --------------------------------------------------------------------------

    def owner_hint(self, part: LedgerPartition) -> tuple[str | None, str | None]:
        """(owner id, its address) as this node's copy of the lease says."""
        try:
            lease = decode_lease(self.read_local(owner_key(part.name)))
        except LedgerMetadataFormatError:
            return None, None
        if lease is None or lease.owner == self.node_id:
            return None, None
        return lease.owner, self.address_of(lease.owner)

    def refuse_not_owner(self, part: LedgerPartition, request_id: int, reply: Replier) -> None:
        owner, address = self.owner_hint(part)
        reply(
            wire.ErrorResponse(
                request_id=request_id,
                code=wire.ErrorCode.NOT_LEADER,
                message=(
                    f"node {self.node_id} does not own {part.descriptor.name}/{part.partition}"
                    + (f"; {owner} does" if owner is not None else "")
                ),
                leader_hint=address,
            )
        )

    def produce(self, part: LedgerPartition, request: wire.Produce, reply: Replier) -> None:
        """Append at the owner (the caller checked the batch's size)."""
        managed = part.managed
        if managed is None or managed.failure is not None:
            self.refuse_not_owner(part, request.request_id, reply)
            return
        # Stamped here, so the answer can say it (records sent without a time get it).
        timestamp_ms = int(time.time() * 1000)
        compressed = None
        if request.compression != "none":
            compressed = CompressedRecords(
                request.compression, request.compressed, request.record_count
            )
        completion = managed.append(
            list(request.records),
            request.producer_id,
            request.base_sequence,
            compressed,
            timestamp_ms,
        )

        def answer(done: Completion[ProduceOutcome]) -> None:
            problem = done.exception()
            if problem is None:
                outcome = done.result()
                reply(
                    wire.ProduceResult(
                        request_id=request.request_id,
                        base_offset=outcome.base_offset,
                        count=outcome.count,
                        duplicate=outcome.duplicate,
                        timestamp_ms=timestamp_ms,
                    )
                )
            elif isinstance(problem, NotPartitionOwnerError | LedgerClosedError):
                if part.managed is managed:
                    self.let_go(part, close=False)
                self.refuse_not_owner(part, request.request_id, reply)
            else:
                reply(produce_refusal(request.request_id, problem))

        completion.add_done_callback(answer)

    def fetch(self, part: LedgerPartition, request: wire.Fetch, reply: Replier) -> None:
        managed = part.managed
        if managed is None or managed.failure is not None:
            self.refuse_not_owner(part, request.request_id, reply)
            return
        if not part.ready:
            unavailable(reply, request.request_id, f"{part.name} is opening")
            return
        completion = managed.read(request.offset, max(1, request.records_max))

        def answer(done: Completion[list[tuple[int, wire.Record]]]) -> None:
            problem = done.exception()
            if isinstance(problem, OffsetOutOfRangeError):
                refuse(reply, request.request_id, wire.ErrorCode.OUT_OF_RANGE, str(problem))
            elif isinstance(problem, QuorumLogError):
                unavailable(reply, request.request_id, str(problem))
            elif problem is not None:
                raise problem
            else:
                reply(
                    wire.FetchResult(
                        request_id=request.request_id,
                        begin_offset=managed.start_offset,
                        end_offset=managed.end_offset,
                        batches=fetched_batches(done.result(), request.bytes_max),
                    )
                )

        completion.add_done_callback(answer)

    def partition_status(
        self, part: LedgerPartition, request: wire.PartitionStatusRequest, reply: Replier
    ) -> None:
        """Only the owner knows where the open ledger ends, so only the owner answers with
        offsets: any other node points at the owner (NOT_LEADER with its address), and an
        owner still opening asks for a retry. Offsets from a non-owner's copy of the ledger
        list would stop at the last closed ledger: a reader trusting them (Spark plans its
        batch from them) would silently miss the open ledger."""
        managed = part.managed
        if managed is None:
            self.refuse_not_owner(part, request.request_id, reply)
            return
        if managed.failure is not None or not part.ready:
            refuse(
                reply,
                request.request_id,
                wire.ErrorCode.UNAVAILABLE,
                f"{part.descriptor.name}/{part.partition} is opening on {self.node_id}",
            )
            return
        end = managed.end_offset
        reply(
            wire.PartitionStatus(
                request_id=request.request_id,
                topic=request.topic,
                partition=request.partition,
                node_id=self.node_id,
                leader=self.node_id,
                replicas=list(part.descriptor.replicas[part.partition]),
                in_sync=[self.node_id],
                begin_offset=managed.start_offset,
                end_offset=end,
                term=0 if managed.record is None else managed.record.owner_epoch,
                commit_index=end,
            )
        )

    # --- stop ------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Close what this node owns and hand each lease to the next candidate."""
        if self.stopping:
            return
        self.stopping = True
        if self.task is not None:
            self.task.cancel()
        if self.sweep_task is not None:
            self.sweep_task.cancel()
        for deletion in self.deletions:
            deletion.cancel()
        closing = [
            completion_future(closed)
            for part in self.partitions.values()
            if (closed := self.let_go(part)) is not None
        ]
        if closing:
            await asyncio.wait(closing, timeout=self.settings.close_wait_seconds)
        if self.parts is not None:
            await self.hand_over_leases(self.parts)
            await self.parts.close()

    async def hand_over_leases(self, parts: LedgerParts) -> None:
        handovers = []
        for part in self.partitions.values():
            held = part.held_value
            lease = decode_lease(held)
            if held is None or lease is None:
                continue
            successor = next_candidate(self.node_id, list(part.descriptor.replicas[part.partition]))
            if successor is None:
                continue
            new_value = encode_lease(OwnerLease(successor, lease.epoch + 1))
            key = owner_key(part.name)
            handovers.append(
                completion_future(
                    parts.call(
                        functools.partial(compare_and_set, parts.lease_keys, key, held, new_value)
                    )
                )
            )
        if handovers:
            await asyncio.wait(handovers, timeout=self.settings.close_wait_seconds)


def next_candidate(node_id: str, candidates: list[str]) -> str | None:
    """The candidate after `node_id`, in order (None: it is the only one)."""
    if node_id not in candidates or len(candidates) < 2:
        return None
    return candidates[(candidates.index(node_id) + 1) % len(candidates)]


def fetched_batches(
    records: list[tuple[int, wire.Record]], bytes_max: int
) -> list[wire.FetchedBatch]:
    """The records read as one batch (they are contiguous), cut at `bytes_max` (one record
    at least, so a large record still gets through)."""
    taken: list[wire.Record] = []
    size = 0
    for _, record in records:
        size += len(record.value or b"") + len(record.key or b"")
        if taken and size > bytes_max:
            break
        taken.append(record)
    if not taken:
        return []
    batch = wire.RecordBatch(producer_id="", base_sequence=0, timestamp_ms=0, records=taken)
    return [wire.FetchedBatch(base_offset=records[0][0], data=wire.encode_record_batch(batch))]


def produce_refusal(request_id: int, problem: BaseException) -> wire.ErrorResponse:
    if isinstance(problem, OutOfOrderSequenceError):
        code = wire.ErrorCode.OUT_OF_RANGE
    elif isinstance(problem, LedgerPendingFullError):
        code = wire.ErrorCode.PENDING_FULL
    elif isinstance(problem, QuorumLogError):
        # Not written, or written and not acknowledged: the producer retries with the same
        # sequence, which the managed ledger's producer table deduplicates.
        code = wire.ErrorCode.UNAVAILABLE
    else:
        raise problem  # a bug, never turned into a retry
    return wire.ErrorResponse(request_id=request_id, code=code, message=str(problem))


def forget_keys(kv: KeyValueStore, name: str, node_id: str) -> None:
    """Delete a deleted partition's ledger list and its lease if this node holds it. The
    lease is compared by holder, not by value: a renewal in flight may have changed it."""
    value = kv.get(managed_ledger_key(name))
    if value is not None:
        compare_and_set(kv, managed_ledger_key(name), value, None)
    for _ in range(DELETE_ATTEMPTS):
        lease_value = kv.get(owner_key(name))
        try:
            lease = decode_lease(lease_value)
        except LedgerMetadataFormatError:
            return
        if lease is None or lease.owner != node_id:
            return
        if compare_and_set(kv, owner_key(name), lease_value, None):
            return
    raise LedgerError(f"{name}: its ownership lease kept changing while being deleted")


def trimmed(name: str, done: Completion[list[int]]) -> None:
    error = done.exception()
    if error is not None:
        log.info("%s: retention failed: %s", name, error)
    elif done.result():
        log.info("%s: retention dropped ledgers %s", name, done.result())


def refuse(reply: Replier, request_id: int, code: wire.ErrorCode, message: str) -> None:
    reply(wire.ErrorResponse(request_id=request_id, code=code, message=message))


def unavailable(reply: Replier, request_id: int, message: str) -> None:
    refuse(reply, request_id, wire.ErrorCode.UNAVAILABLE, message)
