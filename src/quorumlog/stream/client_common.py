"""What the stream clients (Admin, Producer, Consumer) share: the I/O thread, topic
metadata, partition routing and the retry loop for partition requests.

Each client runs one asyncio loop in a background thread (`ClientLoop`) and talks to the
cluster through an `AsyncKVClient` living on that loop: its connection pool, handshake and
metadata-group retry rules (NOT_LEADER hints, back-off, unknown outcomes) are reused as
they are. What the KV client lacks is routing to a *partition*: each partition is its own
Raft group with its own leader among its replicas, so `StreamTransport` keeps one
`EndpointSelector` per partition (built from the replicas' addresses) and runs
`RequestAttempts` against it (`partition_call`).

A replica's address is the one a node of the cluster gives now (`StatusResponse.addresses`,
fetched on first use, with each refresh of the topics, and when no replica of a partition
can be reached); the address stored in the topic descriptor, as old as the topic, is only
the fallback. A node that restarted on a new port is thus found where it listens now.

Error codes from partition replicas, besides those the KV client knows:
- NOT_FOUND: the node does not host the partition, or the topic is unknown there. The
  metadata is refreshed: if the topic or partition is gone it is `TopicNotFoundError`,
  else the replica is just not ready (a new topic) and the request is retried elsewhere.
- OUT_OF_RANGE: for a fetch, an offset outside [begin, end]; for a produce, a sequence the
  partition did not expect. Raised to the caller, who knows which it is.
- NOT_ENOUGH_REPLICAS: an HA topic's master has too few in-sync replicas; nothing was
  written. Retried after a back-off (`kv.connection.BUSY_CODES`) until the request's
  timeout, then `NotEnoughReplicasUnavailableError` (a NotEnoughReplicasError).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from quorumlog.codec.checksum import crc32c
from quorumlog.codec.wire import (
    ClientRequest,
    ErrorCode,
    ErrorResponse,
    Frame,
    ListTopics,
    PartitionStatus,
    PartitionStatusRequest,
    TopicDescriptor,
    TopicList,
)
from quorumlog.errors import ClientError, RequestRejectedError
from quorumlog.kv.async_client import AsyncKVClient
from quorumlog.kv.connection import (
    CLUSTER_ID_DEFAULT,
    MAYBE_APPLIED_CODES,
    EndpointSelector,
    RequestAttempts,
    check_timeout,
)
from quorumlog.kv.lifetime import Closing
from quorumlog.stream.topics import decode_descriptor, topic_key
from quorumlog.tls.config import TLSConfig

ResponseType = TypeVar("ResponseType")
ResultType = TypeVar("ResultType")

LOOP_THREAD_JOIN_SECONDS_MAX = 10.0
"""How long close() waits for the I/O thread; it only has to close sockets by then."""


# --- errors --------------------------------------------------------------------------------


class TopicNotFoundError(RequestRejectedError):
    """The topic does not exist (or has no such partition)."""

    def __init__(self, topic: str, partition: int | None = None) -> None:
        where = f"topic {topic!r}" if partition is None else f"partition {partition} of {topic!r}"
        super().__init__(ErrorCode.NOT_FOUND.value, f"{where} does not exist")
        self.topic = topic
        self.partition = partition


class TopicExistsError(RequestRejectedError):
    """create_topic of a name already taken."""

    def __init__(self, topic: str) -> None:
        super().__init__(ErrorCode.ALREADY_EXISTS.value, f"topic {topic!r} already exists")
        self.topic = topic


class OffsetOutOfRangeError(RequestRejectedError, IndexError):
    """A read at an offset the partition does not hold: deleted by retention (below
    `begin_offset`) or not written yet (past `end_offset`)."""

    def __init__(
        self, topic: str, partition: int, offset: int, begin_offset: int, end_offset: int
    ) -> None:
        if offset < begin_offset:
            reason = f"records below offset {begin_offset} were deleted by retention"
        else:
            reason = f"the partition ends at offset {end_offset}"
        super().__init__(
            ErrorCode.OUT_OF_RANGE.value,
            f"offset {offset} of {topic!r} partition {partition} is out of range "
            f"[{begin_offset}, {end_offset}]: {reason}",
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.begin_offset = begin_offset
        self.end_offset = end_offset


def require(condition: bool, message: str) -> None:
    """An always-on check (unlike `assert`, it survives `python -O`)."""
    if not condition:
        raise ClientError(f"internal check failed: {message}")


# --- partitioning --------------------------------------------------------------------------


def partition_for_key(key: bytes, partition_count: int) -> int:
    """The partition of a keyed record: stable across clients, processes and languages."""
    return crc32c(key) % partition_count


# --- the I/O thread ------------------------------------------------------------------------


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; this is for odd platforms
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class ClientLoop:
    """An asyncio loop running in a daemon thread; blocking callers hand it coroutines."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self.run_forever, name=name, daemon=True)
        self.thread.start()

    def run_forever(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, ResultType]) -> Future[ResultType]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, ResultType]) -> ResultType:
        """Run `coroutine` on the loop and wait for it (its own deadlines bound the wait)."""
        return self.submit(coroutine).result()

    def call_soon(self, callback: Callable[[], object]) -> None:
        self.loop.call_soon_threadsafe(callback)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=LOOP_THREAD_JOIN_SECONDS_MAX)
        if not self.thread.is_alive():
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()


class TrackedAttempts(RequestAttempts):
    """RequestAttempts that also remember whether an attempt *before the latest* may have
    taken effect: then a refusal such as ALREADY_EXISTS may be the echo of our own earlier
    attempt. Only an attempt left unanswered, or answered with a code that may follow an
    append (UNAVAILABLE, TIMEOUT, INTERNAL), counts; NOT_LEADER and the like do not."""

    possibly_applied = False
    earlier_maybe_delivered = False

    def sent(self) -> None:
        self.earlier_maybe_delivered = self.possibly_applied
        super().sent()

    def lost(self, endpoint: str, error: BaseException) -> None:
        self.possibly_applied = True
        super().lost(endpoint, error)

    def answered(
        self, endpoint: str, frame: Frame, expected: type[ResponseType]
    ) -> ResponseType | None:
        if isinstance(frame, ErrorResponse) and frame.code in MAYBE_APPLIED_CODES:
            self.possibly_applied = True
        return super().answered(endpoint, frame, expected)


# --- metadata and partition routing --------------------------------------------------------


class StreamTransport:
    """Topic metadata, partition routing and request retries; lives on one event loop."""

    def __init__(
        self,
        endpoints: list[str],
        timeout: float,
        cluster_id: str,
        client_id: str | None,
        attempt_timeout_seconds: float | None,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        check_timeout(timeout)
        self.timeout = timeout
        self.kv = AsyncKVClient(
            endpoints,
            timeout=timeout,
            cluster_id=cluster_id,
            client_id=client_id,
            attempt_timeout_seconds=attempt_timeout_seconds,
            user=user,
            password=password,
            tls=tls,
            # Topic descriptors and group offsets are internal keys ("__topics/", ...).
            internal_keys=True,
        )
        self.topics: dict[str, TopicDescriptor] = {}
        self.selectors: dict[tuple[str, int], tuple[list[str], EndpointSelector]] = {}
        self.addresses: dict[str, str] = {}
        """Node id → where it listens, as a node last said (beats descriptors' addresses)."""
        self.addresses_fetched = False
        self.addresses_refresh: asyncio.Future[bool] | None = None
        """The refresh of addresses under way, which every caller meanwhile awaits."""
        self.leaders_wanted = False
        """Ask for every partition's leader with the topics (ListTopics.with_leaders): a
        producer sets it, so its first send to each of a thousand partitions goes to the
        leader, not to a replica that answers NOT_LEADER."""

    # --- metadata -------------------------------------------------------------------------

    async def refresh_topics(self, fresh: bool = False) -> dict[str, TopicDescriptor]:
        """Every topic's descriptor. Any node may answer, so a topic created a moment ago
        may be missing; `fresh` asks the metadata leader (falling back to any node)."""
        leader = await self.metadata_leader() if fresh else None
        listed = None
        if leader is not None:
            with contextlib.suppress(ClientError):
                listed = await self.list_topics_at(leader)
        if listed is None:
            listed = await self.list_topics_at(None)
        self.topics = {descriptor.name: descriptor for descriptor in listed.topics}
        await self.refresh_addresses()
        self.learn_leaders(listed.leaders)
        return self.topics

    def learn_leaders(self, leaders: dict[str, list[str]]) -> None:
        """Point each partition's selector at the leader a node named, where the selector
        knows none yet (one it learned from an answer is newer than a listing)."""
        for name, leader_ids in leaders.items():
            descriptor = self.topics.get(name)
            if descriptor is None or len(leader_ids) != len(descriptor.replicas):
                continue
            for partition, leader_id in enumerate(leader_ids):
                address = self.address_of(descriptor, leader_id) if leader_id else None
                if address is None:
                    continue
                with contextlib.suppress(ClientError):
                    selector = self.selector(descriptor, partition)
                    if selector.leader is None and address in selector.endpoints:
                        selector.succeeded_at_leader(address)

    async def refresh_addresses(self) -> bool:
        """Ask a node where every node listens now; True if an address changed. (If no node
        answers, the addresses known stay: the request that needs them will say why.)

        Callers at the same time share one request: a producer whose thousand partitions
        all lost their leader's connection at once asked a thousand times (measured: 7,644
        status requests for 901 produce answers)."""
        if self.addresses_refresh is None:
            self.addresses_refresh = asyncio.ensure_future(self.fetch_addresses())
            self.addresses_refresh.add_done_callback(self.addresses_refreshed)
        return await asyncio.shield(self.addresses_refresh)

    def addresses_refreshed(self, refresh: asyncio.Future[bool]) -> None:
        self.addresses_refresh = None

    async def fetch_addresses(self) -> bool:
        self.addresses_fetched = True
        try:
            status = await self.kv.status()
        except ClientError:
            return False
        changed = any(self.addresses.get(n) != a for n, a in status.addresses.items())
        self.addresses.update(status.addresses)
        return changed

    def address_of(self, descriptor: TopicDescriptor, node_id: str) -> str | None:
        """Where replica `node_id` listens: a node's word now, else the descriptor's."""
        return self.addresses.get(node_id) or descriptor.addresses.get(node_id)

    async def list_topics_at(self, endpoint: str | None) -> TopicList:
        # A node answering ListTopics may be a follower, so it is never cached as leader.
        return await self.kv.call(
            "list topics",
            lambda request_id: ListTopics(request_id=request_id, with_leaders=self.leaders_wanted),
            TopicList,
            side_effects=False,
            at_leader=False,
            endpoint=endpoint,
        )

    async def metadata_leader(self) -> str | None:
        """Where the metadata group's leader listens, as far as any node knows."""
        if self.kv.selector.leader is not None:
            return self.kv.selector.leader
        with contextlib.suppress(ClientError):
            status = await self.kv.status()
            if status.leader is not None:
                return status.addresses.get(status.leader)
        return None

    async def topic(self, name: str, refresh: bool = False) -> TopicDescriptor:
        """The topic's descriptor (cached); TopicNotFoundError if the cluster has none.

        A miss in the cached (or any node's) list is checked with a linearizable read of
        the descriptor, so a topic created a moment ago is found."""
        descriptor = None if refresh else self.topics.get(name)
        if descriptor is None and not refresh:
            descriptor = (await self.refresh_topics()).get(name)
        if descriptor is None:
            descriptor = await self.lookup_topic(name)
        if descriptor is None:
            raise TopicNotFoundError(name)
        return descriptor

    async def lookup_topic(self, name: str) -> TopicDescriptor | None:
        """The descriptor as the metadata group's leader has it (linearizable)."""
        text = await self.kv.get(topic_key(name))
        if text is None:
            self.topics.pop(name, None)
            return None
        descriptor = decode_descriptor(text)
        self.topics[name] = descriptor
        return descriptor

    async def partition_exists(self, topic: str, partition: int) -> bool:
        descriptor = await self.lookup_topic(topic)
        return descriptor is not None and 0 <= partition < len(descriptor.replicas)

    def replica_endpoints(self, descriptor: TopicDescriptor, partition: int) -> list[str]:
        if not 0 <= partition < len(descriptor.replicas):
            raise TopicNotFoundError(descriptor.name, partition)
        found = [self.address_of(descriptor, node_id) for node_id in descriptor.replicas[partition]]
        endpoints = [address for address in found if address is not None]
        if not endpoints:
            raise ClientError(
                f"partition {partition} of {descriptor.name!r} has no replica with a known address"
            )
        return endpoints

    def selector(self, descriptor: TopicDescriptor, partition: int) -> EndpointSelector:
        """The partition's selector; rebuilt (forgetting its leader) when its replicas move."""
        endpoints = self.replica_endpoints(descriptor, partition)
        key = (descriptor.name, partition)
        cached = self.selectors.get(key)
        if cached is not None and cached[0] == endpoints:
            return cached[1]
        selector = EndpointSelector(endpoints)
        self.selectors[key] = (endpoints, selector)
        return selector

    def leader_endpoint(self, topic: str, partition: int) -> str | None:
        cached = self.selectors.get((topic, partition))
        return None if cached is None else cached[1].leader

    # --- partition requests ---------------------------------------------------------------

    def attempts(
        self,
        what: str,
        selector: EndpointSelector,
        side_effects: bool,
        timeout_seconds: float | None = None,
        fixed_endpoint: str | None = None,
        attempt_timeout_seconds: float | None = None,
    ) -> TrackedAttempts:
        if attempt_timeout_seconds is None:
            attempt_timeout_seconds = self.kv.attempt_timeout_seconds
        return TrackedAttempts(
            what,
            selector,
            asyncio.get_running_loop().time,
            self.timeout if timeout_seconds is None else timeout_seconds,
            attempt_timeout_seconds,
            side_effects=side_effects,
            fixed_endpoint=fixed_endpoint,
        )

    async def partition_call(
        self,
        topic: str,
        partition: int,
        what: str,
        make_request: Callable[[int], ClientRequest],
        expected: type[ResponseType],
        side_effects: bool,
        at_leader: bool,
        timeout_seconds: float | None = None,
        fixed_endpoint: str | None = None,
        patient: bool = False,
        attempt_timeout_seconds: float | None = None,
    ) -> ResponseType:
        """Send to the partition's replicas until a wanted answer arrives.

        `at_leader`: only the leader serves it (a produce), so a success caches the leader.
        Otherwise any replica may answer (a fetch), preferring the leader if one is known.
        Raises UnknownOutcomeError / UnavailableError at the deadline (as the KV client
        does), RequestRejectedError on a refusal, TopicNotFoundError if the topic is gone.
        `patient`: an attempt at a node that keeps answering other requests on the same
        connection waits for its answer until the request's deadline, instead of being
        given up after one attempt's time (`StreamConnection.wait_patiently`).
        `attempt_timeout_seconds`: this request's, instead of the client's.
        """
        descriptor = await self.topic(topic)
        if not self.addresses_fetched:
            await self.refresh_addresses()
        selector = self.selector(descriptor, partition)
        attempts = self.attempts(
            what, selector, side_effects, timeout_seconds, fixed_endpoint, attempt_timeout_seconds
        )
        return await self.call_with(
            attempts,
            make_request,
            expected,
            mark_leader=at_leader and fixed_endpoint is None,
            partition=(topic, partition),
            patient=patient,
        )

    async def call_with(
        self,
        attempts: TrackedAttempts,
        make_request: Callable[[int], ClientRequest],
        expected: type[ResponseType],
        mark_leader: bool,
        partition: tuple[str, int] | None = None,
        patient: bool = False,
    ) -> ResponseType:
        """The retry loop of `AsyncKVClient.call`, for any selector. With `partition`, a
        NOT_FOUND answer is checked against fresh metadata (see the module docstring)."""
        while (attempt := attempts.next()) is not None:
            if attempt.delay_seconds:
                await asyncio.sleep(attempt.delay_seconds)  # back-off between attempts
            response = await self.kv.attempt(
                attempts,
                attempt.endpoint,
                attempt.deadline,
                make_request,
                attempts.deadline if patient else None,
            )
            if response is None:
                if partition is not None:
                    await self.follow_moved_replicas(attempts, partition)
                continue
            if (
                partition is not None
                and isinstance(response, ErrorResponse)
                and response.code is ErrorCode.NOT_FOUND
            ):
                topic, number = partition
                await self.replica_not_found(topic, number, attempts, attempt.endpoint, response)
                continue
            answer = attempts.answered(attempt.endpoint, response, expected)
            if answer is not None:
                if mark_leader:
                    attempts.selector.succeeded_at_leader(attempt.endpoint)
                return answer
        raise attempts.give_up_error()

    async def follow_moved_replicas(
        self, attempts: RequestAttempts, partition: tuple[str, int]
    ) -> None:
        """Once every replica of the partition failed in a row, ask where the nodes listen
        now; if a replica moved, the attempts go on with the new addresses."""
        if attempts.fixed_endpoint is not None:
            return
        if attempts.failures_in_row % len(attempts.selector.endpoints) != 0:
            return
        topic, number = partition
        descriptor = self.topics.get(topic)
        if descriptor is None or not await self.refresh_addresses():
            return
        with contextlib.suppress(ClientError):
            attempts.selector = self.selector(descriptor, number)

    async def replica_not_found(
        self,
        topic: str,
        partition: int,
        attempts: RequestAttempts,
        endpoint: str,
        response: ErrorResponse,
    ) -> None:
        """A replica does not know the partition: gone for good, or not started yet."""
        if not await self.partition_exists(topic, partition):
            self.selectors.pop((topic, partition), None)
            raise TopicNotFoundError(topic, partition)
        attempts.last_error = f"{endpoint}: {response.code.value}: {response.message}"
        attempts.selector.failed(endpoint)
        attempts.failed_once(busy=True)

    async def close(self) -> None:
        await self.kv.close()


# --- partition status ----------------------------------------------------------------------


async def partition_status(
    transport: StreamTransport, topic: str, partition: int, endpoint: str | None = None
) -> PartitionStatus:
    """A replica's status of the partition: the leader's if known, else any replica's."""
    return await transport.partition_call(
        topic,
        partition,
        f"status of {topic!r} partition {partition}",
        lambda request_id: PartitionStatusRequest(
            request_id=request_id, topic=topic, partition=partition
        ),
        PartitionStatus,
        side_effects=False,
        at_leader=False,
        fixed_endpoint=endpoint,
    )


async def leader_status(transport: StreamTransport, topic: str, partition: int) -> PartitionStatus:
    """The partition's status as its leader sees it (in-sync replicas, the newest end),
    or as some replica sees it when the leader cannot be reached."""
    status = await partition_status(transport, topic, partition)
    if status.leader is None or status.leader == status.node_id:
        return status
    descriptor = await transport.topic(topic)
    leader_address = transport.address_of(descriptor, status.leader)
    if leader_address is None:
        return status
    try:
        return await partition_status(transport, topic, partition, leader_address)
    except ClientError:
        return status


class BlockingClient(Closing):
    """The base of the blocking stream clients: an I/O thread with a `StreamTransport`."""

    def __init__(
        self,
        endpoints: list[str],
        timeout: float = 10.0,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        client_id: str | None = None,
        attempt_timeout_seconds: float | None = None,
        thread_name: str = "quorumlog-client",
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        """`tls`: talk TLS to the nodes (see `TLSConfig`); None: plaintext."""
        if isinstance(endpoints, str):
            raise TypeError('endpoints is a list of "host:port" strings, not one string')
        check_timeout(timeout)
        self.timeout = timeout
        self.closed = False
        self.io = ClientLoop(thread_name)
        try:
            self.transport = self.io.run(
                self.make_transport(
                    list(endpoints),
                    timeout,
                    cluster_id,
                    client_id,
                    attempt_timeout_seconds,
                    user,
                    password,
                    tls,
                )
            )
        except BaseException:
            self.io.stop()
            raise

    @staticmethod
    async def make_transport(
        endpoints: list[str],
        timeout: float,
        cluster_id: str,
        client_id: str | None,
        attempt_timeout_seconds: float | None,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
    ) -> StreamTransport:
        # Built on the loop, so everything it creates belongs to that loop.
        return StreamTransport(
            endpoints,
            timeout,
            cluster_id,
            client_id,
            attempt_timeout_seconds,
            user,
            password,
            tls,
        )

    def run(self, coroutine: Coroutine[Any, Any, ResultType]) -> ResultType:
        if self.closed:
            coroutine.close()
            raise ClientError("the client is closed")
        return self.io.run(coroutine)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self.io.run(self.transport.close())
        self.io.stop()


__all__ = [
    "BlockingClient",
    "ClientLoop",
    "OffsetOutOfRangeError",
    "StreamTransport",
    "TopicExistsError",
    "TopicNotFoundError",
    "partition_for_key",
]
