"""KVClient: the blocking KV client (one request at a time per client).

    from quorumlog import KVClient

    with KVClient(["127.0.0.1:2379", "127.0.0.1:2380"]) as client:
        client.put("colour", "blue")
        client.get("colour")  # "blue"

It finds the leader and caches it, follows NOT_LEADER hints, and retries a write with the
same sequence number until `timeout` seconds pass, so a write takes effect at most once.
It raises `UnknownOutcomeError` when a write may or may not have happened,
`UnavailableError` when no node could take it, and `SessionExpiredError` when the cluster
no longer has the client's session (the write was not done; later calls use a new
session). Give each thread its own client; a lock also serialises concurrent calls on one
client, so sharing one is safe, just not fast.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import ssl
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import TypeVar

from quorumlog.auth.credentials import (
    Credentials,
    CredentialsSource,
    authenticate_request,
    credentials_source,
    screen_answer,
    token_from,
)
from quorumlog.codec import wire
from quorumlog.codec.frame import FrameDecoder, FrameError, encode_frame
from quorumlog.codec.kv_v3 import KeyValue
from quorumlog.codec.wire import (
    AuthenticatedRequest,
    ClientRequest,
    Done,
    Frame,
    KVCommand,
    KVCommandResult,
    KVReadResult,
    KVScan,
    KVScanResult,
    KVWriteResult,
    MemberChangeRequest,
    StatusRequest,
    StatusResponse,
    TransferLeaderRequest,
    decode,
    encode,
)
from quorumlog.errors import ClientError, SessionExpiredError, UnknownOutcomeError
from quorumlog.kv.connection import (
    CLUSTER_ID_DEFAULT,
    ClientSession,
    CommandIdentity,
    EndpointSelector,
    Member,
    RequestAttempts,
    SequenceTracker,
    SessionHolder,
    attempt_timeout_for,
    check_timeout,
    hello_frame,
    members_from_status,
    new_client_id,
    parse_endpoint,
    welcome_node_id,
)
from quorumlog.kv.lifetime import Closing
from quorumlog.kv.requests import (
    SessionCommand,
    prefix_end,
    read_request,
    read_value,
    write_request,
)
from quorumlog.kv.v3_client import WATCH_WAIT_SECONDS, V3Operations
from quorumlog.tls.config import TLSConfig
from quorumlog.tls.handshake import closed_after_handshake_error, open_blocking

ResponseType = TypeVar("ResponseType")
RECEIVE_BYTES = 256 * 1024


class ConnectionLost(ClientError):
    """The node closed the connection (used inside the client; callers never see it)."""


class BlockingConnection:
    """One TCP connection to one node, after a successful handshake."""

    def __init__(self, endpoint: str, sock: socket.socket, node_id: str) -> None:
        self.endpoint = endpoint
        self.sock = sock
        self.node_id = node_id
        self.decoder = FrameDecoder()
        self.received: list[bytes] = []
        self.token = ""
        """The auth token this connection's requests carry ("" : none)."""
        self.token_invalid = False
        """The node no longer knows the token: open a new connection (authenticating again)."""
        self.authenticated = False
        """Credentials were sent (the token may still be "" if auth was off then)."""

    @classmethod
    def open(
        cls,
        endpoint: str,
        cluster_id: str,
        client_id: str,
        deadline: float,
        credentials: Credentials | None = None,
        tls: TLSConfig | None = None,
    ) -> BlockingConnection:
        """Connect (over TLS with `tls`) and shake hands; TLSHandshakeError if TLS failed."""
        host, port = parse_endpoint(endpoint)
        sock = open_blocking(
            host, port, tls, max(deadline - time.monotonic(), 0.001), endpoint=endpoint
        )
        connection = cls(endpoint, sock, node_id="")
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(hello_frame(cluster_id, client_id))
            try:
                frame = connection.receive_frame(deadline)
            except (ConnectionLost, ConnectionResetError, ssl.SSLError) as error:
                if tls is None:
                    raise
                raise closed_after_handshake_error(endpoint) from error
            connection.node_id = welcome_node_id(frame, endpoint)
            if credentials is not None:
                sock.sendall(encode_frame(encode(authenticate_request(credentials))))
                connection.token = token_from(connection.receive_frame(deadline), endpoint)
                connection.authenticated = True
        except BaseException:
            connection.close()
            raise
        return connection

    @property
    def usable(self) -> bool:
        return not self.token_invalid

    def send(self, frame: ClientRequest) -> None:
        if self.token:
            frame = AuthenticatedRequest(
                request_id=frame.request_id, token=self.token, request=frame
            )
        self.sock.sendall(encode_frame(encode(frame)))

    def receive_frame(self, deadline: float) -> Frame:
        """The next frame; TimeoutError at the deadline, ConnectionLost if the node closed."""
        while not self.received:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer before the deadline")
            self.sock.settimeout(remaining)
            data = self.sock.recv(RECEIVE_BYTES)
            if not data:
                raise ConnectionLost(f"{self.endpoint} closed the connection")
            self.received.extend(self.decoder.feed(data))
        return decode(self.received.pop(0))

    def receive(self, request_id: int, deadline: float) -> Frame:
        """The answer to `request_id`, skipping late answers to attempts already given up."""
        while True:
            frame = self.receive_frame(deadline)
            if getattr(frame, "request_id", None) == request_id:
                frame, replace = screen_answer(frame, self.authenticated)
                if replace:
                    self.token_invalid = True
                return frame

    def close(self) -> None:
        self.sock.close()


def scan_request(
    request_id: int, start: str, end: str, limit: int, stale: bool, internal: bool = False
) -> KVScan:
    return KVScan(
        request_id=request_id, start=start, end=end, limit=limit, stale=stale, internal=internal
    )


# Whatever a broken connection or a garbled frame raises: the attempt is lost.
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    ConnectionLost,
    FrameError,
    *wire.DECODE_ERRORS,
)


class AttemptSender(ABC):
    """One try of one request at one node over a `BlockingConnection`, for the blocking
    clients; they say which connection to use for a node and how to drop one."""

    next_request_id: int
    """The request id of the next attempt (each client starts it at 1)."""

    def attempt(
        self,
        attempts: RequestAttempts,
        endpoint: str,
        deadline: float,
        make_request: Callable[[int], ClientRequest],
    ) -> Frame | None:
        """One try at one node: the frame answered, or None after reporting the failure."""
        try:
            connection = self.connect(endpoint, deadline)
        except TRANSPORT_ERRORS as error:
            attempts.connect_failed(endpoint, error)
            return None
        request_id = self.next_request_id
        self.next_request_id += 1
        try:
            attempts.sent()
            connection.send(make_request(request_id))
            return self.receive(connection, request_id, deadline)
        except TRANSPORT_ERRORS as error:
            # Also on a timeout: the connection may hold a late answer or a dead peer.
            self.drop_connection(connection)
            attempts.lost(endpoint, error)
            return None

    def receive(self, connection: BlockingConnection, request_id: int, deadline: float) -> Frame:
        """The answer to `request_id` (a seam: tests override it to lose answers)."""
        return connection.receive(request_id, deadline)

    @abstractmethod
    def connect(self, endpoint: str, deadline: float) -> BlockingConnection:
        """The connection to `endpoint`, opened by `deadline` if there is none."""

    @abstractmethod
    def drop_connection(self, connection: BlockingConnection) -> None:
        """Close `connection` and forget it (it may hold a late answer or a dead peer)."""


@contextlib.contextmanager
def tracked_sequence(sequences: SequenceTracker, identity: CommandIdentity) -> Iterator[int]:
    """The sequence for one logged request, acknowledged once the block ends, or held for
    `identity` if it ends in UnknownOutcomeError (a retry of the same request reuses it)."""
    sequence = sequences.allocate(identity, time.monotonic())
    try:
        yield sequence
    except UnknownOutcomeError:
        sequences.hold_unknown(sequence, identity, time.monotonic())
        raise
    except BaseException:
        sequences.acknowledge(sequence)
        raise
    sequences.acknowledge(sequence)


class KVOperations(SessionHolder, ABC):
    """put, append, delete and cas of the blocking KV clients, on top of their `write`."""

    def session_write(
        self,
        identity: CommandIdentity,
        send: Callable[[ClientSession, KVCommand], KVWriteResult],
        answered_by: Callable[[], str],
        payload: bytes | None = None,
    ) -> KVCommandResult:
        """Number the command of `identity` in the current session, `send` it, and read
        its one result (`answered_by`: who answered, for errors). If the cluster says the
        session is gone, later writes go under a new one; the refused command was not
        done and is not sent again."""
        session = self.session
        pending = SessionCommand(session, identity, time.monotonic(), payload)
        try:
            try:
                response = send(session, pending.command)
            except BaseException as error:
                pending.failed(error, time.monotonic())
                raise
            return pending.answered(response, answered_by())
        except SessionExpiredError:
            self.renew_session(session)
            raise

    def put(
        self, key: str, value: str | bytes, lease: int = 0, prev_kv: bool = False
    ) -> KeyValue | None:
        """Set `key`. A text value without a lease is a plain put; bytes, a lease or
        `prev_kv` make it a v3 put, which answers the key before when `prev_kv`."""
        if isinstance(value, str) and not lease and not prev_kv:
            self.write("put", key, value, None)
            return None
        return self.put_v3(key, value, lease, prev_kv)

    def put_v3(self, key: str, value: str | bytes, lease: int, prev_kv: bool) -> KeyValue | None:
        raise ClientError("this client puts text values only (no leases, no prev_kv)")

    def append(self, key: str, value: str) -> None:
        self.write("append", key, value, None)

    def delete(self, key: str) -> None:
        self.write("delete", key, None, None)

    def cas(self, key: str, expected: str | None, new: str | None) -> bool:
        """Set `key` to `new` if it holds `expected` now (None: missing / delete). True if set."""
        return self.write("cas", key, new, expected).ok

    @abstractmethod
    def write(
        self, op: str, key: str, value: str | None, expected: str | None
    ) -> KVCommandResult: ...


class KVClient(KVOperations, V3Operations, AttemptSender, Closing):
    """A blocking client of the replicated KV. See the module docstring; the etcd v3-style
    calls (range, txn, leases, watch, compact) are `kv.v3_client.V3Operations`."""

    put_v3 = V3Operations.put_v3

    def __init__(
        self,
        endpoints: list[str],
        timeout: float = 5.0,
        cluster_id: str = CLUSTER_ID_DEFAULT,
        client_id: str | None = None,
        attempt_timeout_seconds: float | None = None,
        user: str | None = None,
        password: str | None = None,
        credentials: CredentialsSource | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        """`tls`: talk TLS to the nodes (see `TLSConfig`); None: plaintext."""
        check_timeout(timeout)
        self.timeout = timeout
        self.attempt_timeout_seconds = attempt_timeout_for(timeout, attempt_timeout_seconds)
        self.cluster_id = cluster_id
        self.tls = tls
        self.session = ClientSession(client_id or new_client_id(), hold_seconds=timeout)
        self.selector = EndpointSelector(endpoints)
        self.credentials_source = credentials_source(user, password, credentials)
        """With auth: who this client is, asked at each new connection (`quorumlog.auth`)."""
        self.connection: BlockingConnection | None = None
        self.next_request_id = 1
        self.lock = threading.RLock()
        self.closed = False

    # --- KV (put, append, delete and cas: KVOperations) ---------------------------------

    def get(self, key: str, stale: bool = False) -> str | None:
        """The value of `key`, linearizable; `stale=True` lets any node answer from its state."""
        response = self.call(
            f"get {key!r}",
            lambda request_id: read_request(key, request_id, stale),
            KVReadResult,
            side_effects=False,
            at_leader=not stale,
        )
        return read_value(response)

    def scan_prefix(
        self, prefix: str, stale: bool = False, page_keys: int = 1000, *, internal: bool = False
    ) -> list[tuple[str, str]]:
        """Every key starting with `prefix` and its value, in key order, read page by page
        (each page linearizable unless `stale`; the whole is not one snapshot). Keys that
        start with "__" are left out unless `internal` (quorumlog's own services only:
        kv/internal_keys.py)."""
        end = prefix_end(prefix)
        items: list[tuple[str, str]] = []
        start: str | None = prefix
        while start is not None:
            page = self.call(
                f"scan {prefix!r}",
                functools.partial(
                    scan_request,
                    start=start,
                    end=end,
                    limit=page_keys,
                    stale=stale,
                    internal=internal,
                ),
                KVScanResult,
                side_effects=False,
                at_leader=not stale,
            )
            items.extend(page.items)
            start = page.next_start
        return items

    def write(
        self,
        op: str,
        key: str,
        value: str | None,
        expected: str | None,
        *,
        internal: bool = False,
    ) -> KVCommandResult:
        """One command; `internal` lets it reach keys starting with "__" (quorumlog's own
        services only, through kv/internal_keys.py; the node refuses them otherwise)."""
        with self.lock:

            def send(session: ClientSession, command: KVCommand) -> KVWriteResult:
                return self.call(
                    f"{op} {key!r}",
                    lambda request_id: write_request(
                        session, [command], request_id, internal=internal
                    ),
                    KVWriteResult,
                    side_effects=True,
                )

            return self.session_write((op, key, value, expected), send, self.selector.choose)

    def answered_by(self) -> str:
        return self.selector.choose()

    def watch_client(self) -> KVClient:
        # Polls are held up to WATCH_WAIT_SECONDS at the leader: attempts wait longer.
        return KVClient(
            self.selector.endpoints,
            timeout=max(self.timeout, WATCH_WAIT_SECONDS + 10),
            cluster_id=self.cluster_id,
            attempt_timeout_seconds=WATCH_WAIT_SECONDS + 2,
        )

    # --- cluster ------------------------------------------------------------------------

    def status(self, endpoint: str | None = None) -> StatusResponse:
        """One node's view of the group: `endpoint`'s, or the cached leader's."""
        return self.call(
            "status",
            lambda request_id: StatusRequest(request_id=request_id),
            StatusResponse,
            side_effects=False,
            at_leader=False,
            endpoint=endpoint,
        )

    def member_list(self) -> list[Member]:
        status = self.status()
        if not status.is_leader and status.leader is not None:
            # Ask the leader itself: a follower may not know the newest configuration yet.
            leader_address = status.addresses.get(status.leader)
            if leader_address is not None:
                status = self.status(leader_address)
        return members_from_status(status)

    def member_add(self, node_id: str, address: str, learner: bool = False) -> str:
        kind = "add_learner" if learner else "add_voter"
        return self.change_members(kind, node_id, address)

    def member_promote(self, node_id: str) -> str:
        return self.change_members("promote_learner", node_id, None)

    def member_remove(self, node_id: str) -> str:
        return self.change_members("remove", node_id, None)

    def change_members(self, kind: str, node_id: str, address: str | None) -> str:
        done = self.call(
            f"{kind} {node_id}",
            lambda request_id: MemberChangeRequest(
                request_id=request_id, kind=kind, node_id=node_id, address=address
            ),
            Done,
            side_effects=True,
            retry_after_delivery=False,
        )
        return done.detail

    def transfer_leader(self, node_id: str) -> str:
        done = self.call(
            f"transfer leadership to {node_id}",
            lambda request_id: TransferLeaderRequest(request_id=request_id, target=node_id),
            Done,
            side_effects=True,
            retry_after_delivery=False,
        )
        return done.detail

    # --- the request loop ---------------------------------------------------------------

    def call(
        self,
        what: str,
        make_request: Callable[[int], ClientRequest],
        expected: type[ResponseType],
        side_effects: bool,
        retry_after_delivery: bool = True,
        at_leader: bool = True,
        endpoint: str | None = None,
    ) -> ResponseType:
        """Send until a wanted answer arrives, following the rules of `RequestAttempts`."""
        with self.lock:
            if self.closed:
                raise ClientError("the client is closed")
            attempts = RequestAttempts(
                what,
                self.selector,
                time.monotonic,
                self.timeout,
                self.attempt_timeout_seconds,
                side_effects=side_effects,
                retry_after_delivery=retry_after_delivery,
                fixed_endpoint=endpoint,
            )
            while (attempt := attempts.next()) is not None:
                if attempt.delay_seconds:
                    time.sleep(attempt.delay_seconds)  # back-off between attempts
                if self.closed:
                    # Closed from another thread: give up now, with the error that says
                    # whether a write may have taken effect.
                    raise attempts.give_up_error()
                response = self.attempt(attempts, attempt.endpoint, attempt.deadline, make_request)
                if response is None:
                    continue
                answer = attempts.answered(attempt.endpoint, response, expected)
                if answer is not None:
                    if at_leader and endpoint is None:
                        self.selector.succeeded_at_leader(attempt.endpoint)
                    return answer
            raise attempts.give_up_error()

    def connect(self, endpoint: str, deadline: float) -> BlockingConnection:
        connection = self.connection
        if connection is not None and connection.endpoint == endpoint and connection.usable:
            return connection
        fresh = BlockingConnection.open(
            endpoint, self.cluster_id, self.client_id, deadline, self.credentials(), self.tls
        )
        if connection is not None:
            connection.close()
        self.connection = fresh
        return fresh

    def credentials(self) -> Credentials | None:
        source = self.credentials_source
        return None if source is None else source()

    def drop_connection(self, connection: BlockingConnection) -> None:
        connection.close()
        if self.connection is connection:
            self.connection = None

    # --- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        """Close; a call in flight on another thread gives up at once (its socket is shut
        down under it) instead of running to its timeout, so a stopping process can close
        its clients without waiting out their calls."""
        self.closed = True
        connection = self.connection
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
        with self.lock:
            if self.connection is not None:
                self.drop_connection(self.connection)


__all__ = ["AttemptSender", "KVClient", "KVOperations", "Member", "tracked_sequence"]
