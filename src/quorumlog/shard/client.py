"""ShardedKVClient: the blocking client of the sharded KV (one request at a time per client).

    from quorumlog import ShardedKVClient

    with ShardedKVClient(["127.0.0.1:2379"]) as client:  # the shard controller's nodes
        client.put("colour", "blue")
        client.get("colour")  # "blue"

A key goes to a shard by a stable hash (`shard.config.shard_for_key`), the shard to the
group that owns it in the cached configuration, and the request to that group's cached
leader. A group that answers WRONG_GROUP (the shard moved, or is still arriving), or that
cannot be reached, makes the client fetch the latest configuration from the controller and
route again, until `timeout` seconds pass.

Exactly once across migrations: the client has one client id and one sequence tracker for
every group. A write that may have reached a group is resent with the same (client id,
sequence) to whichever group owns the shard now; groups hand their dedup sessions over
with the shard, so the new owner recognises a write the old owner applied. One KVClient
per group could not do this: each would have its own client id and sequences.

Errors are those of KVClient: `UnknownOutcomeError` when a write may or may not have
happened, `UnavailableError` when it certainly did not, `RequestRejectedError` when the
cluster refused it, `SessionExpiredError` when the owning group no longer has this client's
session for the shard (not done; later writes go under a new client id and sequences).

A group's servers may be addresses ("host:port") or node ids (what `quorumlog dev up
--groups` joins). Node ids are resolved to where those nodes listen now, as a node of the
cluster says (its `StatusResponse.addresses`, fetched again with each new configuration
and whenever routing fails): a configuration is stored in the controller's log for good,
and a node may have restarted on a new port since, so an id in a configuration keeps
working where an address would go stale.

The parts without I/O (`ShardRouter`, `RoutedCall`, `route`, `attempt_answer` and the
request builders) are separate so they can be tested without a cluster, and so the
simulator's event-driven driver (testing/sim/shardkv/client.py) runs the same rules;
`BlockingTransport` is the I/O both this client and `ShardAdmin` use.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from quorumlog.auth.credentials import CredentialsSource, credentials_source
from quorumlog.codec.wire import (
    ClientRequest,
    ControllerRequest,
    ControllerResponse,
    ErrorCode,
    ErrorResponse,
    Frame,
    KVCommand,
    KVCommandResult,
    KVRead,
    KVReadResult,
    KVScan,
    KVScanResult,
    KVWrite,
    KVWriteResult,
    StatusRequest,
    StatusResponse,
    shard_group_name,
)
from quorumlog.errors import (
    ClientError,
    RequestRejectedError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.kv.client import (
    AttemptSender,
    BlockingConnection,
    KVOperations,
)
from quorumlog.kv.connection import (
    BACKOFF_SECONDS_INITIAL,
    CLUSTER_ID_DEFAULT,
    ClientSession,
    EndpointSelector,
    RequestAttempts,
    SessionHolder,
    attempt_timeout_for,
    check_timeout,
    describe,
    is_endpoint,
    new_client_id,
)
from quorumlog.kv.lifetime import Closing
from quorumlog.kv.requests import prefix_end
from quorumlog.kv.v3_client import WATCH_WAIT_SECONDS
from quorumlog.shard.config import UNASSIGNED_GID, ShardConfiguration, shard_for_key
from quorumlog.shard.controller_commands import (
    ControllerCommand,
    ControllerResult,
    Query,
    decode_results,
    encode_commands,
)
from quorumlog.shard.v3_client import ShardedV3Operations
from quorumlog.tls.config import TLSConfig

ResponseType = TypeVar("ResponseType")

REROUTE_BACKOFF_SECONDS_MAX = 0.1
"""The longest pause between two routings of one request. A shard that is being pulled is
usually served again within a few monitor rounds (100 ms each by default), so the pause
stays short."""
GROUP_UNREACHABLE_PASSES = 2
"""After this many failed tries per server of a group in a row, the client asks the
controller again: the group may have left and its shards gone elsewhere."""
QUERY_LATEST = -1


class WrongGroupAnswer(ClientError):
    """A group said it does not serve the shard now (used inside the client)."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(f"{endpoint}: wrong_group: {message}")


# --- routing (no I/O) -----------------------------------------------------------------------


def resolve_servers(servers: list[str], addresses: dict[str, str]) -> list[str]:
    """A group's servers as endpoints: an address as it is, a node id as the address the
    cluster knows for it now; a node id with no known address is left out."""
    endpoints: list[str] = []
    for server in servers:
        endpoint = server if is_endpoint(server) else addresses.get(server)
        if endpoint is not None and endpoint not in endpoints:
            endpoints.append(endpoint)
    return endpoints


def names_node_ids(configuration: ShardConfiguration) -> bool:
    """Whether some group lists a server by node id (so addresses must be looked up)."""
    return any(
        not is_endpoint(server) for servers in configuration.groups.values() for server in servers
    )


class ShardRouter:
    """The cached configuration, where nodes listen, and, per group, whom to ask (its
    cached leader first).

    A group's selector survives changes that keep its servers' endpoints (a new
    configuration, fresh addresses), so the leader it learned stays cached; it is rebuilt
    when they change."""

    def __init__(self) -> None:
        self.configuration: ShardConfiguration | None = None
        self.addresses: dict[str, str] = {}
        """Node id → address, as a node of the cluster last said."""
        self.selectors: dict[int, EndpointSelector] = {}

    def learn(self, configuration: ShardConfiguration) -> bool:
        """Adopt `configuration` unless the cached one is as new; True if adopted."""
        current = self.configuration
        if current is not None and configuration.number <= current.number:
            return False
        self.configuration = configuration
        self.forget_moved_selectors()
        return True

    def learn_addresses(self, addresses: dict[str, str]) -> bool:
        """Take a node's view of where every node listens; True if any address changed."""
        changed = any(self.addresses.get(node) != address for node, address in addresses.items())
        self.addresses.update(addresses)
        self.forget_moved_selectors()
        return changed

    def forget_moved_selectors(self) -> None:
        for gid in list(self.selectors):
            if self.endpoints_of(gid) != self.selectors[gid].endpoints:
                del self.selectors[gid]

    def endpoints_of(self, gid: int) -> list[str]:
        """Where group `gid`'s servers listen, as far as known (empty: none known)."""
        if self.configuration is None:
            return []
        servers = self.configuration.groups.get(gid)
        return resolve_servers(servers, self.addresses) if servers is not None else []

    def shard_of(self, key: str) -> int | None:
        """The shard of `key`; None before any configuration (the shard count is unknown)."""
        if self.configuration is None:
            return None
        return shard_for_key(key, self.configuration.shard_count)

    def gid_of_key(self, key: str) -> int | None:
        """The group owning `key`'s shard in the cached configuration; None if none does."""
        shard = self.shard_of(key)
        configuration = self.configuration
        if shard is None or configuration is None:
            return None
        gid = configuration.gid_of_shard(shard)
        return None if gid == UNASSIGNED_GID else gid

    def selector(self, gid: int) -> EndpointSelector:
        """Whom to ask in group `gid` (which must have a server with a known endpoint)."""
        selector = self.selectors.get(gid)
        if selector is None:
            endpoints = self.endpoints_of(gid)
            if not endpoints:
                raise ClientError(f"no server of group {gid} has a known address")
            selector = EndpointSelector(endpoints)
            self.selectors[gid] = selector
        return selector


class RoutedCall:
    """The rules for one request across routings: one deadline for all of them, and
    whether any attempt may have reached a group (then the error is UnknownOutcomeError)."""

    def __init__(
        self, what: str, clock: Callable[[], float], timeout_seconds: float, side_effects: bool
    ) -> None:
        self.what = what
        self.clock = clock
        self.timeout_seconds = timeout_seconds
        self.deadline = clock() + timeout_seconds
        self.side_effects = side_effects
        self.maybe_delivered = False
        self.last_error = "no attempt made"
        self.backoff_seconds = BACKOFF_SECONDS_INITIAL

    def remaining_seconds(self) -> float:
        return self.deadline - self.clock()

    def round_ended(self, attempts: RequestAttempts) -> None:
        """Carry one routing's outcome over: a write sent once may have been applied."""
        self.maybe_delivered = self.maybe_delivered or attempts.maybe_delivered
        if attempts.maybe_delivered or attempts.failures_in_row:
            # A routing that made no attempt (no time left) has no error worth reporting.
            self.last_error = attempts.last_error

    def failed(self, error: str) -> None:
        self.last_error = error

    def pause_seconds(self, configuration_changed: bool) -> float:
        """How long to wait before routing again: at once if the configuration moved on
        (the new owner likely serves), else a growing pause (the shard is on its way)."""
        if configuration_changed:
            self.backoff_seconds = BACKOFF_SECONDS_INITIAL
            return 0.0
        pause = min(self.backoff_seconds, max(self.remaining_seconds(), 0.0))
        self.backoff_seconds = min(self.backoff_seconds * 2, REROUTE_BACKOFF_SECONDS_MAX)
        return pause

    def give_up_error(self) -> ClientError:
        if self.side_effects and self.maybe_delivered:
            return UnknownOutcomeError(
                f"{self.what}: no answer in time; it may or may not have taken effect "
                f"(last error: {self.last_error})"
            )
        return UnavailableError(
            f"{self.what}: no group could serve it within {self.timeout_seconds:g}s "
            f"(last error: {self.last_error})"
        )


def group_unreachable(attempts: RequestAttempts) -> bool:
    """Every server of the group failed `GROUP_UNREACHABLE_PASSES` times in a row."""
    return attempts.failures_in_row >= GROUP_UNREACHABLE_PASSES * len(attempts.selector.endpoints)


def never(attempts: RequestAttempts) -> bool:
    return False


def controller_result(results: bytes, what: str) -> ControllerResult:
    """The one result of a one-command controller request; raises if it was rejected."""
    decoded = decode_results(results)
    if len(decoded) != 1:
        raise ClientError(f"{what}: the controller answered 1 command with {len(decoded)} results")
    [result] = decoded
    if not result.ok:
        raise RequestRejectedError("rejected", f"{what}: {result.error}")
    return result


def route(router: ShardRouter, key: str, call: RoutedCall) -> int | None:
    """The group to ask for `key` now; None (the reason noted on `call`) if the cached
    configuration names none with a known address: then refresh and route again."""
    gid = router.gid_of_key(key)
    if gid is None:
        call.failed(f"no group owns the shard of {key!r}")
        return None
    if not router.endpoints_of(gid):
        call.failed(f"no server of group {gid} has a known address")
        return None
    return gid


def shard_scan_request(
    request_id: int, group: str, *, start: str, end: str | None, limit: int, stale: bool, shard: int
) -> KVScan:
    return KVScan(
        request_id=request_id,
        start=start,
        end=end,
        limit=limit,
        stale=stale,
        group=group,
        shards=[shard],
    )


def route_shard(router: ShardRouter, shard: int, call: RoutedCall) -> int | None:
    """As `route`, for a shard rather than a key's shard."""
    configuration = router.configuration
    if configuration is None or not 0 <= shard < configuration.shard_count:
        call.failed(f"no configuration has shard {shard}")
        return None
    gid = configuration.gid_of_shard(shard)
    if gid == UNASSIGNED_GID:
        call.failed(f"no group owns shard {shard}")
        return None
    if not router.endpoints_of(gid):
        call.failed(f"no server of group {gid} has a known address")
        return None
    return gid


def attempt_answer(
    attempts: RequestAttempts,
    endpoint: str,
    frame: Frame,
    expected: type[ResponseType],
    at_leader: bool,
) -> ResponseType | None:
    """What one attempt's answer means: the answer wanted (its endpoint then cached as the
    leader, if `at_leader`), None to try again, WrongGroupAnswer on WRONG_GROUP; raises a
    refusal."""
    if isinstance(frame, ErrorResponse) and frame.code is ErrorCode.WRONG_GROUP:
        raise WrongGroupAnswer(endpoint, frame.message)
    answer = attempts.answered(endpoint, frame, expected)
    if answer is not None and at_leader and attempts.fixed_endpoint is None:
        attempts.selector.succeeded_at_leader(endpoint)
    return answer


def read_request(key: str, stale: bool) -> Callable[[int, str], ClientRequest]:
    """The read of `key` (request id, group) → KVRead."""
    return lambda request_id, group: KVRead(
        request_id=request_id, keys=[key], stale=stale, group=group
    )


def read_value(response: KVReadResult) -> str | None:
    if len(response.values) != 1:
        raise ClientError(f"asked for 1 key, got {len(response.values)} values")
    return response.values[0]


def write_request(
    session: ClientSession, command: KVCommand
) -> Callable[[int, str], ClientRequest]:
    """The write of `command` in `session` (request id, group) → KVWrite; every routing
    sends the same command with the same sequence."""
    return lambda request_id, group: KVWrite(
        request_id=request_id,
        client_id=session.client_id,
        commands=[command],
        first_unacknowledged=session.first_unacknowledged(),
        group=group,
    )


def controller_request(
    client_id: str, command: ControllerCommand, first_unacknowledged: int
) -> Callable[[int], ClientRequest]:
    encoded = encode_commands([command])
    return lambda request_id: ControllerRequest(
        request_id=request_id,
        client_id=client_id,
        commands=encoded,
        first_unacknowledged=first_unacknowledged,
    )


def queried_configuration(result: ControllerResult, number: int) -> ShardConfiguration:
    if result.configuration is None:
        raise ClientError(f"the controller answered query {number} without a configuration")
    return result.configuration


# --- transport ------------------------------------------------------------------------------


class BlockingTransport(AttemptSender):
    """Connections to every node this client talks to, one per endpoint (groups share nodes),
    and the attempt loop of one request within one group."""

    def __init__(
        self,
        cluster_id: str,
        client_id: str,
        attempt_timeout_seconds: float,
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        self.cluster_id = cluster_id
        self.client_id = client_id
        self.tls = tls
        self.attempt_timeout_seconds = attempt_timeout_seconds
        self.credentials = credentials
        """With auth: who this client is, asked at each new connection (`quorumlog.auth`)."""
        self.connections: dict[str, BlockingConnection] = {}
        self.next_request_id = 1

    def call(
        self,
        attempts: RequestAttempts,
        make_request: Callable[[int], ClientRequest],
        expected: type[ResponseType],
        at_leader: bool = True,
        end_round: Callable[[RequestAttempts], bool] = never,
    ) -> ResponseType | None:
        """Send until the wanted answer arrives (returned); None when `attempts` gives up or
        `end_round` says to stop; WrongGroupAnswer on WRONG_GROUP; raises a refusal."""
        while (attempt := attempts.next()) is not None:
            if attempt.delay_seconds:
                time.sleep(attempt.delay_seconds)  # back-off between attempts
            frame = self.attempt(attempts, attempt.endpoint, attempt.deadline, make_request)
            if frame is not None:
                answer = attempt_answer(attempts, attempt.endpoint, frame, expected, at_leader)
                if answer is not None:
                    return answer
            if end_round(attempts):
                return None
        return None

    def connect(self, endpoint: str, deadline: float) -> BlockingConnection:
        connection = self.connections.get(endpoint)
        if connection is not None and not connection.usable:
            self.drop_connection(connection)
            connection = None
        if connection is None:
            connection = BlockingConnection.open(
                endpoint,
                self.cluster_id,
                self.client_id,
                deadline,
                None if self.credentials is None else self.credentials(),
                self.tls,
            )
            self.connections[endpoint] = connection
        return connection

    def drop_connection(self, connection: BlockingConnection) -> None:
        connection.close()
        if self.connections.get(connection.endpoint) is connection:
            del self.connections[connection.endpoint]

    def close(self) -> None:
        for connection in list(self.connections.values()):
            self.drop_connection(connection)


class ControllerChannel:
    """Requests to the shard controller group, through its cached leader."""

    def __init__(
        self, endpoints: list[str], transport: BlockingTransport, timeout_seconds: float
    ) -> None:
        self.selector = EndpointSelector(endpoints)
        self.transport = transport
        self.timeout_seconds = timeout_seconds

    def send(
        self,
        what: str,
        command: ControllerCommand,
        side_effects: bool,
        first_unacknowledged: int = 0,
        timeout_seconds: float | None = None,
    ) -> ControllerResult:
        attempts = RequestAttempts(
            what,
            self.selector,
            time.monotonic,
            self.timeout_seconds if timeout_seconds is None else timeout_seconds,
            self.transport.attempt_timeout_seconds,
            side_effects=side_effects,
        )
        response = self.transport.call(
            attempts,
            controller_request(self.transport.client_id, command, first_unacknowledged),
            ControllerResponse,
        )
        if response is None:
            raise attempts.give_up_error()
        return controller_result(response.results, what)

    def query(self, number: int, timeout_seconds: float | None = None) -> ShardConfiguration:
        """Configuration `number` (-1: the latest). Queries are not logged: no sequence."""
        result = self.send(
            f"query configuration {number}",
            Query(0, number),
            side_effects=False,
            timeout_seconds=timeout_seconds,
        )
        return queried_configuration(result, number)

    def addresses(self, timeout_seconds: float) -> dict[str, str]:
        """Where every node listens, as one of the controller's nodes knows it now."""
        attempts = RequestAttempts(
            "where the nodes listen",
            self.selector,
            time.monotonic,
            timeout_seconds,
            self.transport.attempt_timeout_seconds,
            side_effects=False,
        )
        response = self.transport.call(
            attempts,
            lambda request_id: StatusRequest(request_id=request_id),
            StatusResponse,
            at_leader=False,
        )
        if response is None:
            raise attempts.give_up_error()
        return response.addresses


# --- the clients ----------------------------------------------------------------------------


class ControllerClient(SessionHolder, Closing):
    """What ShardedKVClient and ShardAdmin share: one transport to every node, the
    controller channel through it, one session (client id and sequences), a lock and the
    closed flag. The transport keeps the first client id (its handshakes and controller
    queries); only the session is renewed, by ShardedKVClient, after SessionExpiredError."""

    closed_message = "the client is closed"

    def __init__(
        self,
        endpoints: list[str],
        timeout: float,
        cluster_id: str,
        client_id: str,
        attempt_timeout_seconds: float | None,
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        check_timeout(timeout)
        self.timeout = timeout
        self.session = ClientSession(client_id, hold_seconds=timeout)
        self.transport = BlockingTransport(
            cluster_id,
            client_id,
            attempt_timeout_for(timeout, attempt_timeout_seconds),
            credentials,
            tls,
        )
        self.controller = ControllerChannel(endpoints, self.transport, timeout)
        self.lock = threading.RLock()
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise ClientError(self.closed_message)

    def refresh_addresses(self, router: ShardRouter, timeout_seconds: float) -> bool:
        """Fetch where the nodes listen into `router` if its configuration names node ids;
        True if an address changed."""
        if router.configuration is None or not names_node_ids(router.configuration):
            return False
        return router.learn_addresses(self.controller.addresses(timeout_seconds))

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.transport.close()


class ShardedKVClient(KVOperations, ControllerClient, ShardedV3Operations):
    """A blocking client of the sharded KV. See the module docstring; ranges with
    revisions and watches: `shard.v3_client`."""

    def __init__(
        self,
        endpoints: list[str],
        timeout: float = 5.0,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        client_id: str | None = None,
        attempt_timeout_seconds: float | None = None,
        user: str | None = None,
        password: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        """`tls`: talk TLS to the nodes (see `TLSConfig`); None: plaintext."""
        super().__init__(
            endpoints,
            timeout,
            cluster_id,
            client_id or new_client_id(),
            attempt_timeout_seconds,
            credentials_source(user, password),
            tls,
        )
        self.router = ShardRouter()

    # --- KV (put, append, delete and cas: KVOperations) ---------------------------------

    def get(self, key: str, stale: bool = False) -> str | None:
        """The value of `key`, linearizable; `stale=True` lets any replica of the owning
        group answer from its state (may be old)."""
        response = self.routed(
            f"get {key!r}",
            key,
            read_request(key, stale),
            KVReadResult,
            side_effects=False,
            at_leader=not stale,
        )
        return read_value(response)

    def write(self, op: str, key: str, value: str | None, expected: str | None) -> KVCommandResult:
        with self.lock:

            def send(session: ClientSession, command: KVCommand) -> KVWriteResult:
                return self.routed(
                    f"{op} {key!r}",
                    key,
                    write_request(session, command),
                    KVWriteResult,
                    side_effects=True,
                )

            return self.session_write(
                (op, key, value, expected), send, lambda: shard_group_name_of(self.router, key)
            )

    def range_items(
        self,
        key: str,
        end: str | None = None,
        prefix: bool = False,
        limit: int = 0,
        stale: bool = False,
        page_keys: int = 1000,
    ) -> list[tuple[str, str]]:
        """The keys in [key, end) (`end` None: to the last key; or the keys starting with
        `key` if `prefix`) and their values, in key order, at most `limit` (0: all).

        Ordering: keys come sorted across shards, but the whole is not one snapshot. Each
        shard is read on its own, in shard order, page by page, each page linearizable
        (unless `stale`) at its own moment in its group; a write to another shard between
        two pages may or may not show. `range` reads each shard as one snapshot, with
        revisions (`shard.v3_client`)."""
        end = prefix_end(key) if prefix and key else (None if prefix else end)
        with self.lock:
            self.check_open()
            if self.router.configuration is None:
                self.query()
            configuration = self.router.configuration
            shard_count = configuration.shard_count if configuration is not None else 0
        items: list[tuple[str, str]] = []
        for shard in range(shard_count):
            items.extend(self.scan_shard(shard, key, end, stale, page_keys))
        items.sort()
        return items[:limit] if limit > 0 else items

    def scan_shard(
        self, shard: int, start: str, end: str | None, stale: bool, page_keys: int
    ) -> list[tuple[str, str]]:
        items: list[tuple[str, str]] = []
        next_start: str | None = start
        while next_start is not None:
            page = self.routed(
                f"scan shard {shard}",
                "",
                functools.partial(
                    shard_scan_request,
                    start=next_start,
                    end=end,
                    limit=page_keys,
                    stale=stale,
                    shard=shard,
                ),
                KVScanResult,
                side_effects=False,
                at_leader=not stale,
                shard=shard,
            )
            items.extend(page.items)
            next_start = page.next_start
        return items

    # --- shards (for ranges and watches: shard.v3_client) -------------------------------

    def shard_count(self) -> int:
        return self.cached_configuration().shard_count

    def shard_of(self, key: str) -> int:
        return shard_for_key(key, self.cached_configuration().shard_count)

    def cached_configuration(self) -> ShardConfiguration:
        with self.lock:
            self.check_open()
            if self.router.configuration is None:
                self.query()
            configuration = self.router.configuration
            if configuration is None:
                raise ClientError("the controller answered no configuration")
            return configuration

    def watch_client(self) -> ShardedKVClient:
        # Polls are held up to WATCH_WAIT_SECONDS at the leader: attempts wait longer.
        client = ShardedKVClient(
            self.controller.selector.endpoints,
            timeout=max(self.timeout, WATCH_WAIT_SECONDS + 10),
            cluster_id=self.transport.cluster_id,
            attempt_timeout_seconds=WATCH_WAIT_SECONDS + 2,
            tls=self.transport.tls,
        )
        client.transport.credentials = self.transport.credentials
        return client

    # --- configuration ------------------------------------------------------------------

    def query(self, number: int = QUERY_LATEST) -> ShardConfiguration:
        """Configuration `number` from the controller (-1: the latest)."""
        with self.lock:
            self.check_open()
            configuration = self.controller.query(number)
            if number == QUERY_LATEST:
                self.router.learn(configuration)
            return configuration

    # --- routing ------------------------------------------------------------------------

    def routed(
        self,
        what: str,
        key: str,
        make_request: Callable[[int, str], ClientRequest],
        expected: type[ResponseType],
        side_effects: bool,
        at_leader: bool = True,
        shard: int | None = None,
    ) -> ResponseType:
        """Send to the group owning `key` (or `shard`), routing again after WRONG_GROUP or
        an unreachable group, until the answer or the deadline. Every routing sends the
        same request."""
        with self.lock:
            self.check_open()
            call = RoutedCall(what, time.monotonic, self.timeout, side_effects)
            if self.router.configuration is None:
                self.refresh(call)
            while call.remaining_seconds() > 0:
                gid = (
                    route(self.router, key, call)
                    if shard is None
                    else route_shard(self.router, shard, call)
                )
                if gid is None:
                    self.pause_and_refresh(call)
                    continue
                answer = self.ask_group(call, gid, make_request, expected, at_leader)
                if answer is not None:
                    return answer
                self.pause_and_refresh(call)
            raise call.give_up_error()

    def ask_group(
        self,
        call: RoutedCall,
        gid: int,
        make_request: Callable[[int, str], ClientRequest],
        expected: type[ResponseType],
        at_leader: bool,
    ) -> ResponseType | None:
        """One routing: the answer from group `gid`, or None to route again."""
        attempts = RequestAttempts(
            call.what,
            self.router.selector(gid),
            call.clock,
            call.remaining_seconds(),
            self.transport.attempt_timeout_seconds,
            side_effects=call.side_effects,
        )
        group = shard_group_name(gid)
        try:
            answer = self.transport.call(
                attempts,
                lambda request_id: make_request(request_id, group),
                expected,
                at_leader=at_leader,
                end_round=group_unreachable,
            )
        except WrongGroupAnswer as wrong:
            call.round_ended(attempts)
            call.failed(str(wrong))
            return None
        call.round_ended(attempts)
        return answer

    def pause_and_refresh(self, call: RoutedCall) -> None:
        changed = self.refresh(call)
        pause = call.pause_seconds(changed)
        if pause > 0:
            time.sleep(pause)  # back-off while the shard is on its way to its owner

    def refresh(self, call: RoutedCall) -> bool:
        """Fetch the latest configuration, and where its servers listen now (a node may
        have moved: that too can be why a group did not answer), within the call's time;
        True if either changed."""
        remaining = call.remaining_seconds()
        if remaining <= 0:
            return False
        try:
            configuration = self.controller.query(QUERY_LATEST, timeout_seconds=remaining)
            newer = self.router.learn(configuration)
            moved = self.refresh_addresses(self.router, max(call.remaining_seconds(), 0.001))
        except (UnavailableError, UnknownOutcomeError) as error:
            call.failed(f"controller: {describe(error)}")
            return False
        return newer or moved


def shard_group_name_of(router: ShardRouter, key: str) -> str:
    """The group `key` was routed to, for error messages."""
    gid = router.gid_of_key(key)
    return shard_group_name(gid) if gid is not None else "no group"


__all__ = [
    "BlockingTransport",
    "ControllerChannel",
    "ControllerClient",
    "RoutedCall",
    "ShardRouter",
    "ShardedKVClient",
    "WrongGroupAnswer",
    "attempt_answer",
    "controller_request",
    "group_unreachable",
    "names_node_ids",
    "queried_configuration",
    "read_request",
    "read_value",
    "resolve_servers",
    "route",
    "write_request",
]
