"""TCP between nodes and from clients: framed msgspec messages on asyncio.

- One listening socket serves peers and clients; the first frame (`Hello`) says which.
- One connection per peer pair: the node with the smaller id dials, with backoff; both
  ends send on it. Raft tolerates loss, so a message for a peer with no live connection
  (or a full write buffer) is dropped and counted, never queued without bound.
- Addresses follow the nodes: a peer's `Hello` says where it listens now (`listen`), and
  the handler learns it (`on_peer_address`), so a node that restarted on a new port is
  found again. For that a restarted node must reach its peers even when it is the one that
  waits to be dialled: with no link to a smaller-id peer for a moment, the larger id dials
  it too ("announces"). Of two links between a pair, the one the smaller id dialled stays
  and the other is closed, the same choice on both ends, so the pair settles on one.
- Raft messages bound for one peer are coalesced into one `PeerBatch` frame per event
  loop turn.
- Node-level liveness (runtime/liveness.py): every frame from a peer is reported to
  `on_peer_heard`, and `ping` sends an empty `PeerBatch` to a peer that was sent nothing
  since the last ping (any frame says "alive" as well as a ping does).
- Anything malformed — garbage bytes, a frame over `frame_bytes_max`, a wrong cluster id,
  an unexpected message — closes that connection with a logged reason; the node goes on.
- TLS (`tls=NodeTLS(...)`, see tls/config.py): the listener then accepts sockets itself
  and runs each one's handshake (`admit`), so a failed one is logged with its reason (an
  asyncio server drops that reason) and only that connection is closed. A connection
  whose first byte is not a TLS record is a plaintext client: it gets a `Refused` frame
  saying TLS is required, in plaintext, so it can tell its user. Peers dial with the
  node's dialing certificate and verify the node they reach; a connection that says it
  is a peer is held to the peer rules (`check_peer_certificate`) at its Hello.
- Heartbeats as rows (codec/heartbeat_rows.py): both ends of a peer link say whether they
  read plain heartbeats and their answers as rows (`Hello.heartbeat_rows`,
  `Welcome.heartbeat_rows`); `send_row` queues a row for a peer, and the flush writes the
  rows in the peer's `PeerBatch`, or as envelopes to a peer that did not say it reads them.
- Feature levels (codec/feature_levels.py): both ends of a peer link say their release's
  level (`Hello.feature_level`, `Welcome.feature_level`); `on_peer_level` notes it and
  may refuse the peer (a release below the cluster's committed level).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import Protocol, cast

from quorumlog.codec import wire
from quorumlog.codec.feature_levels import FEATURE_LEVEL
from quorumlog.codec.frame import (
    FRAME_BYTES_MAX_DEFAULT,
    FRAME_HEADER,
    FrameDecoder,
    FrameError,
    encode_frame,
)
from quorumlog.codec.heartbeat_rows import HeartbeatAnswerRow, HeartbeatRow, answer_of, push_of
from quorumlog.tls.config import NodeTLS, server_context
from quorumlog.tls.handshake import (
    TLS_RECORD_TYPES,
    TLS_REQUIRED_REASON,
    check_peer_certificate,
    create_connection,
    describe_handshake_error,
    peer_common_name,
)

log = logging.getLogger("quorumlog.transport")

WRITE_BUFFER_BYTES_MAX = 32 * 1024 * 1024
"""Past this much unsent data on one connection, further Raft messages are dropped."""
WRITE_BUFFER_BYTES_HIGH = 4 * 1024 * 1024
"""Past this much unsent data, a client connection stops being read (back-pressure)."""
CLIENT_WRITE_BUFFER_BYTES_MAX = 64 * 1024 * 1024
"""Past this much, a client that does not read its replies is disconnected."""
RECONNECT_DELAY_SECONDS_MIN = 0.05
RECONNECT_DELAY_SECONDS_MAX = 2.0
ANNOUNCE_DELAY_SECONDS_INITIAL = 0.25
"""How long a node waits for a smaller-id peer to dial it before dialling that peer itself:
the smaller id usually dials first, and a second link would only be closed again."""
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
HANDSHAKE_TIMEOUT_SECONDS = 5.0
ROUND_TRIP_EVERY_PINGS = 7
"""Every this many liveness pings to a peer, one is a `PeerPing` whatever else went to it
(its pong gives a round-trip time): about one a second with default ticks (a ping every
3 ticks of 50 ms)."""
LISTEN_BACKLOG = 100


class Handler(Protocol):
    def on_peer_batch(self, batch: wire.PeerBatch) -> None: ...

    def on_client_request(
        self, request: wire.ClientRequest, reply: Replier, peer_common_name: str = ""
    ) -> None:
        """`peer_common_name`: with client certificate auth, the CN of the client's
        verified certificate ("" without one, or without that auth)."""
        ...

    def on_peer_address(self, peer: str, address: str) -> None:
        """`peer` says, on a live connection, that it listens at `address`."""


Replier = Callable[[wire.Frame], None]


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def announced_address(listen: str, connection_host: str | None) -> str | None:
    """Where a peer that said `listen` in its Hello can be reached: as said, or with a
    wildcard host ("0.0.0.0") replaced by the host the connection came from; None if
    `listen` is empty or malformed (then nothing is learned)."""
    try:
        host, port = parse_address(listen)
    except ValueError:
        return None
    if host in WILDCARD_HOSTS:
        if not connection_host:
            return None
        host = connection_host
    return format_address(host, port)


class Connection(asyncio.Protocol):
    def __init__(self, endpoint: Endpoint, dialed_peer: str | None) -> None:
        self.endpoint = endpoint
        self.dialed_peer = dialed_peer
        self.peer_id: str | None = None
        self.is_client = False
        self.ready = False
        self.decoder = FrameDecoder(endpoint.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.description = "?"
        self.remote_host: str | None = None
        self.client_common_name: str | None = None
        """The CN of a client's certificate, read once ("" if none), with client cert auth."""
        self.heartbeat_rows = False
        """The peer said it reads heartbeats as rows (`Hello/Welcome.heartbeat_rows`)."""

    def certificate_common_name(self) -> str | None:
        """The CN of the certificate the other end presented over TLS, if any (for
        authentication by certificate, `--client-cert-auth`)."""
        return peer_common_name(self.transport) if self.transport is not None else None

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES_HIGH)
        self.endpoint.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.description = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.remote_host = str(peer[0]) if peer else None
        if self.dialed_peer is not None:
            self.write(
                wire.Hello(
                    cluster_id=self.endpoint.cluster_id,
                    sender=self.endpoint.node_id,
                    is_peer=True,
                    listen=self.endpoint.listen_address,
                    feature_level=FEATURE_LEVEL,
                    heartbeat_rows=self.endpoint.heartbeat_rows,
                )
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.connections.discard(self)
        if self.peer_id is not None:
            self.endpoint.peer_gone(self.peer_id, self)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        """Replies back up: a client that does not read gets no new requests served."""
        if self.is_client and self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.is_client and self.transport is not None:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.peer_id is not None:
            received = self.endpoint.peer_bytes_received
            received[self.peer_id] = received.get(self.peer_id, 0) + len(data)
        try:
            payloads = self.decoder.feed(data)
        except FrameError as error:
            self.abort(str(error))
            return
        for payload in payloads:
            try:
                frame = wire.decode(payload)
            except wire.DECODE_ERRORS as error:
                self.abort(f"malformed frame: {error}")
                return
            if not self.handle(frame):
                return

    # --- frames -------------------------------------------------------------------------

    def handle(self, frame: wire.Frame) -> bool:
        """Act on one frame; False once the connection was closed."""
        endpoint = self.endpoint
        if not self.ready:
            return self.handshake(frame)
        if isinstance(frame, wire.PeerBatch) and self.peer_id is not None:
            if endpoint.on_peer_heard is not None:
                endpoint.on_peer_heard(self.peer_id)
            endpoint.handler.on_peer_batch(frame)
            return True
        if isinstance(frame, wire.PeerPing | wire.PeerPong) and self.peer_id is not None:
            endpoint.round_trip_frame(self, frame)
            return True
        if self.is_client and isinstance(frame, wire.CLIENT_REQUEST_TYPES):
            request = cast(wire.ClientRequest, frame)
            if endpoint.tls.client_cert_auth:
                # The client's verified certificate names its user (etcd's --client-cert-auth).
                if self.client_common_name is None:
                    self.client_common_name = self.certificate_common_name() or ""
                endpoint.handler.on_client_request(request, self.write, self.client_common_name)
            else:
                endpoint.handler.on_client_request(request, self.write)
            return True
        self.abort(f"unexpected {type(frame).__name__} on a {self.kind()} connection")
        return False

    def handshake(self, frame: wire.Frame) -> bool:
        endpoint = self.endpoint
        if self.dialed_peer is not None:
            if isinstance(frame, wire.Welcome) and frame.node_id == self.dialed_peer:
                refusal = endpoint.peer_level(self.dialed_peer, frame.feature_level)
                if refusal is not None:
                    self.abort(refusal)
                    return False
                self.ready = True
                self.peer_id = self.dialed_peer
                self.heartbeat_rows = frame.heartbeat_rows
                endpoint.peer_ready(self.dialed_peer, self)
                return True
            self.abort(f"bad handshake answer {frame!r}")
            return False
        if not isinstance(frame, wire.Hello):
            self.abort(f"expected Hello first, got {type(frame).__name__}")
            return False
        if frame.cluster_id != endpoint.cluster_id:
            self.refuse(f"cluster id {frame.cluster_id!r} is not {endpoint.cluster_id!r}")
            return False
        if frame.protocol_version != wire.PROTOCOL_VERSION:
            self.refuse(f"protocol version {frame.protocol_version} is not supported")
            return False
        if frame.is_peer and self.transport is not None:
            problem = check_peer_certificate(self.transport, endpoint.tls)
            if problem is not None:
                self.refuse(f"peer {frame.sender!r}: {problem}")
                return False
        if frame.is_peer:
            refusal = endpoint.peer_level(frame.sender, frame.feature_level)
            if refusal is not None:
                self.refuse(refusal)
                return False
        self.ready = True
        self.write(
            wire.Welcome(
                node_id=endpoint.node_id,
                produce_many=True,
                feature_level=FEATURE_LEVEL,
                heartbeat_rows=endpoint.heartbeat_rows,
            )
        )
        if frame.is_peer:
            self.peer_id = frame.sender
            self.heartbeat_rows = frame.heartbeat_rows
            address = announced_address(frame.listen, self.remote_host)
            if address is not None and frame.sender != endpoint.node_id:
                endpoint.handler.on_peer_address(frame.sender, address)
            endpoint.peer_ready(frame.sender, self)
        else:
            self.is_client = True
        return True

    def dialled_by_smaller_id(self) -> bool:
        """Whether this peer link is the one the pair keeps (see the module docstring)."""
        own = self.endpoint.node_id
        if self.dialed_peer is not None:
            return own < self.dialed_peer
        return self.peer_id is not None and self.peer_id < own

    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def kind(self) -> str:
        if self.is_client:
            return "client"
        return "peer" if self.peer_id is not None or self.dialed_peer else "unidentified"

    def write(self, frame: wire.Frame) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.is_client and transport.get_write_buffer_size() > CLIENT_WRITE_BUFFER_BYTES_MAX:
            # Requests already read keep producing replies; past this bound the client is
            # not reading them, and holding more would let one client exhaust our memory.
            self.abort(f"client left over {CLIENT_WRITE_BUFFER_BYTES_MAX} reply bytes unread")
            return
        payload = wire.encode(frame)
        if len(payload) > self.endpoint.frame_bytes_max:
            # An answer too large for one frame (a read of many large values): say so
            # instead of sending what the client would have to refuse.
            request_id = getattr(frame, "request_id", None)
            if request_id is None:
                raise FrameError(f"{type(frame).__name__} of {len(payload)} bytes is too large")
            payload = wire.encode(
                wire.ErrorResponse(
                    request_id=request_id,
                    code=wire.ErrorCode.TOO_LARGE,
                    message=f"the answer is {len(payload)} bytes; frame_bytes_max is "
                    f"{self.endpoint.frame_bytes_max}: ask for less at once",
                )
            )
        self.write_payload(payload)

    def write_payload(self, payload: bytes) -> None:
        """Send one encoded frame. Header and payload go out as two buffers (uvloop writes
        them with one writev), so a large frame is not copied to put 4 bytes in front."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.peer_id is not None:
            sent = self.endpoint.peer_bytes_sent
            sent[self.peer_id] = sent.get(self.peer_id, 0) + FRAME_HEADER.size + len(payload)
        transport.writelines((FRAME_HEADER.pack(len(payload)), payload))

    def buffered_bytes(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport else 0

    def refuse(self, reason: str) -> None:
        log.warning("refusing connection from %s: %s", self.description, reason)
        self.write(wire.Refused(reason=reason))
        if self.transport is not None:
            self.transport.close()  # close after the Refused frame is flushed

    def abort(self, reason: str) -> None:
        log.warning("closing %s connection from %s: %s", self.kind(), self.description, reason)
        self.endpoint.protocol_errors += 1
        if self.transport is not None:
            self.transport.abort()


class Endpoint:
    """This node's network presence: the listener, the peer links, the outgoing queues."""

    def __init__(
        self,
        node_id: str,
        cluster_id: str,
        peer_addresses: dict[str, str],
        handler: Handler,
        frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
        tls: NodeTLS | None = None,
    ) -> None:
        self.node_id = node_id
        self.tls = tls or NodeTLS()
        self.dialing_tls = self.tls.dialing_tls()
        self.tls_refusals = 0
        """Connections refused at the TLS handshake (or for speaking plaintext)."""
        self.listening_socket: socket.socket | None = None
        self.accepting: asyncio.Task[None] | None = None
        self.admitting: set[asyncio.Task[None]] = set()
        self.dial_failures: dict[str, str] = {}
        """Per peer: why the last dial failed at the TLS handshake (logged once a reason)."""
        self.cluster_id = cluster_id
        self.peer_addresses = dict(peer_addresses)
        self.handler = handler
        self.frame_bytes_max = frame_bytes_max
        self.peers: dict[str, Connection] = {}
        self.connections: set[Connection] = set()
        self.outgoing: dict[str, list[wire.RaftEnvelope]] = {}
        self.outgoing_rows: dict[str, OutgoingRows] = {}
        """Per peer: heartbeats and answers as rows (`send_row`), written with `outgoing`."""
        self.heartbeat_rows = True
        """Say in the handshake that we read rows, and write rows to a peer that says so.
        False: behave as a node from before rows (every row goes as an envelope)."""
        self.rows_sent = 0
        self.rows_sent_as_envelopes = 0
        """Rows written as rows, and as envelopes (to a peer that reads no rows)."""
        self.flush_scheduled = False
        self.server: asyncio.Server | None = None
        self.dialers: dict[str, asyncio.Task[None]] = {}
        self.retired_dialers: set[asyncio.Task[None]] = set()
        """Dialers cancelled for a moved or removed peer, awaited at close (a cancelled task
        left pending when the loop ends is reported as destroyed)."""
        """Per peer: dialling it (a larger id) or announcing to it (a smaller id)."""
        self.listen_address = ""
        """Where peers should reach this node (said in every Hello we send)."""
        self.dropped_messages = 0
        self.protocol_errors = 0
        self.stopping = False
        self.on_peer_heard: Callable[[str], None] | None = None
        """Told the peer's id for every frame from a peer (node-level liveness)."""
        self.sent_since_ping: set[str] = set()
        self.on_peer_link: Callable[[str, bool], None] | None = None
        """Told (peer, True) when a peer gets a link where it had none, (peer, False) when
        its link goes and none replaces it (events: links lost and regained)."""
        self.on_round_trip: Callable[[str, float], None] | None = None
        """Told (peer, seconds) for each round trip measured on a peer link."""
        self.pings_sent: dict[str, int] = {}
        self.peer_bytes_sent: dict[str, int] = {}
        self.peer_bytes_received: dict[str, int] = {}
        """Bytes on peer links per peer since start (counted per read and write, not per
        message), for the node's metrics."""
        self.on_peer_level: Callable[[str, int], str | None] | None = None
        """Told (peer, level) for the feature level a peer said in its handshake; returns
        the reason to refuse the peer, or None."""

    def peer_level(self, peer: str, level: int) -> str | None:
        """Why `peer`, which said `level` in its handshake, is refused; None if it is not."""
        return None if self.on_peer_level is None else self.on_peer_level(peer, level)

    async def listen(self, host: str, port: int, advertise: str = "") -> int:
        """Listen on `host:port` (0: any free port); returns the port bound. Peers are told
        `advertise` as our address, else `host` and the port bound."""
        loop = asyncio.get_running_loop()
        if self.tls.enabled:
            self.listening_socket = listening_socket(host, port)
            self.accepting = loop.create_task(self.accept_forever(self.listening_socket))
            bound_port = int(self.listening_socket.getsockname()[1])
        else:
            self.server = await loop.create_server(lambda: Connection(self, None), host, port)
            bound_port = int(self.server.sockets[0].getsockname()[1])
        self.listen_address = advertise or format_address(host, bound_port)
        self.update_peers(self.peer_addresses)
        return bound_port

    @property
    def listening(self) -> bool:
        return self.server is not None or self.listening_socket is not None

    async def accept_forever(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                accepted, _ = await loop.sock_accept(listener)
            except OSError as error:
                # Out of descriptors, say: this connection is lost, the listener is not.
                log.warning("accepting a connection failed: %s", error)
                await asyncio.sleep(RECONNECT_DELAY_SECONDS_MIN)
                continue
            task = loop.create_task(self.admit(accepted))
            self.admitting.add(task)
            task.add_done_callback(self.admitting.discard)

    async def admit(self, accepted: socket.socket) -> None:
        """Run one accepted socket's TLS handshake; refuse it, with a logged reason, if
        it speaks plaintext or the handshake fails (see the module docstring)."""
        loop = asyncio.get_running_loop()
        description = describe_socket(accepted)
        try:
            accepted.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_SECONDS):
                first = await first_byte(loop, accepted)
            if first is None:
                accepted.close()
                return
            if first not in TLS_RECORD_TYPES:
                self.refuse_plaintext(accepted, description)
                return
            await loop.connect_accepted_socket(
                lambda: Connection(self, None),
                accepted,
                ssl=server_context(self.tls),
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_SECONDS,
            )
        except (OSError, TimeoutError) as error:
            self.tls_refusals += 1
            log.warning(
                "refusing connection from %s: TLS handshake failed: %s",
                description,
                describe_handshake_error(error),
            )
            accepted.close()

    def refuse_plaintext(self, accepted: socket.socket, description: str) -> None:
        self.tls_refusals += 1
        log.warning("refusing connection from %s: it does not speak TLS", description)
        refusal = encode_frame(wire.encode(wire.Refused(reason=TLS_REQUIRED_REASON)))
        with contextlib.suppress(OSError):
            accepted.send(refusal)  # a few bytes into an empty send buffer: never blocks
        accepted.close()

    def update_peers(self, peer_addresses: dict[str, str]) -> None:
        """Dial every known peer whose id sorts after ours (they wait for us to dial), and
        announce ourselves to the others when they leave us without a link."""
        if not self.listening:
            self.peer_addresses = dict(peer_addresses)
            return  # not listening yet: `listen` starts the dialers
        previous = self.peer_addresses
        self.peer_addresses = {p: a for p, a in peer_addresses.items() if p != self.node_id}
        for peer, address in sorted(self.peer_addresses.items()):
            if peer in self.dialers and previous.get(peer) != address:
                # The peer moved (or its address was a placeholder): dial the new one now.
                self.retire_dialer(peer)
            if peer not in self.dialers:
                dial = self.dial_forever if peer > self.node_id else self.announce_forever
                self.dialers[peer] = asyncio.create_task(dial(peer, address))
        for peer in [p for p in self.dialers if p not in self.peer_addresses]:
            self.retire_dialer(peer)

    def retire_dialer(self, peer: str) -> None:
        task = self.dialers.pop(peer)
        task.cancel()
        self.retired_dialers.add(task)
        task.add_done_callback(self.retired_dialers.discard)

    async def dial_forever(self, peer: str, address: str) -> None:
        delay = RECONNECT_DELAY_SECONDS_MIN
        while not self.stopping:
            connection = await self.dial(peer, address)
            if connection is not None:
                await asyncio.wait([connection.closed])
                if connection.ready:
                    delay = RECONNECT_DELAY_SECONDS_MIN  # it worked for a while: retry fast
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_SECONDS_MAX)

    async def announce_forever(self, peer: str, address: str) -> None:
        """Dial a smaller-id peer (whose job it is to dial us) whenever we have had no link
        to it for a moment: it may not know where we listen now, and our Hello tells it.
        Once it dials us, its link replaces this one (`peer_ready`)."""
        delay = ANNOUNCE_DELAY_SECONDS_INITIAL
        while not self.stopping:
            link = self.peers.get(peer)
            if link is not None:
                await asyncio.wait([link.closed])
                delay = ANNOUNCE_DELAY_SECONDS_INITIAL
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_DELAY_SECONDS_MAX)
            if peer in self.peers:
                continue  # it dialled us meanwhile
            connection = await self.dial(peer, address)
            if connection is not None:
                await asyncio.wait([connection.closed])

    async def dial(self, peer: str, address: str) -> Connection | None:
        """A connection to `peer` at `address` with our Hello sent; None if none was made."""
        loop = asyncio.get_running_loop()
        host, port = parse_address(address)
        try:
            _, connection = await asyncio.wait_for(
                create_connection(
                    loop, lambda: Connection(self, peer), host, port, self.dialing_tls
                ),
                HANDSHAKE_TIMEOUT_SECONDS,
            )
        except (OSError, TimeoutError) as error:
            if self.dialing_tls is not None:
                self.dial_failed(peer, address, error)
            return None
        self.dial_failures.pop(peer, None)
        return connection

    def dial_failed(self, peer: str, address: str, error: BaseException) -> None:
        """Log why a TLS dial failed, once per reason (the dialer retries every moment)."""
        reason = describe_handshake_error(error)
        if self.dial_failures.get(peer) != reason:
            self.dial_failures[peer] = reason
            log.warning("cannot reach peer %s at %s: %s", peer, address, reason)

    def peer_ready(self, peer: str, connection: Connection) -> None:
        old = self.peers.get(peer)
        if (
            old is not None
            and old is not connection
            and old.usable()
            and old.dialled_by_smaller_id()
            and not connection.dialled_by_smaller_id()
        ):
            # The pair's own link is up: this second one (the larger id announcing itself)
            # has done its job — its Hello said where the peer listens.
            log.debug("closing a second link with %s: the smaller id's link is up", peer)
            if connection.transport is not None:
                connection.transport.close()
            return
        self.peers[peer] = connection
        if old is None and self.on_peer_link is not None:
            self.on_peer_link(peer, True)
        if old is not None and old is not connection and old.transport is not None:
            old.transport.close()  # the peer restarted and dialled again: the new link wins

    def peer_gone(self, peer: str, connection: Connection) -> None:
        if self.peers.get(peer) is connection:
            del self.peers[peer]
            if self.on_peer_link is not None and not self.stopping:
                self.on_peer_link(peer, False)

    def send(self, peer: str, envelope: wire.RaftEnvelope) -> None:
        queue = self.outgoing.get(peer)
        if queue is None:
            queue = self.outgoing[peer] = []
        queue.append(envelope)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def send_row(self, peer: str, row: HeartbeatRow | HeartbeatAnswerRow) -> None:
        """Queue a heartbeat or an answer as a row (codec/heartbeat_rows.py) for `peer`."""
        rows = self.outgoing_rows.get(peer)
        if rows is None:
            rows = self.outgoing_rows[peer] = OutgoingRows()
        if type(row) is HeartbeatRow:
            rows.heartbeats.append(row)
        else:
            rows.answers.append(row)  # type: ignore[arg-type]
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        outgoing, self.outgoing = self.outgoing, {}
        outgoing_rows, self.outgoing_rows = self.outgoing_rows, {}
        for peer, envelopes in outgoing.items():
            rows = outgoing_rows.pop(peer, None)
            self.flush_peer(peer, envelopes, rows)
        for peer, rows in outgoing_rows.items():
            self.flush_peer(peer, [], rows)

    def flush_peer(
        self, peer: str, envelopes: list[wire.RaftEnvelope], rows: OutgoingRows | None
    ) -> None:
        connection = self.peers.get(peer)
        if connection is None or connection.buffered_bytes() > WRITE_BUFFER_BYTES_MAX:
            self.dropped_messages += len(envelopes) + (0 if rows is None else rows.count())
            return
        self.sent_since_ping.add(peer)
        if rows is None:
            self.write_batches(connection, envelopes)
        elif connection.heartbeat_rows and self.heartbeat_rows:
            self.rows_sent += rows.count()
            self.write_batches(connection, envelopes, rows.heartbeats, rows.answers)
        else:  # a node from before rows: every row as the envelope it stands for
            self.rows_sent_as_envelopes += rows.count()
            self.write_batches(connection, [*envelopes, *rows.envelopes(self.node_id, peer)])

    def ping(self, peer: str) -> None:
        """Say "alive" to `peer`: an empty PeerBatch, unless a frame went to it since the
        last ping (that said it already)."""
        pings = self.pings_sent[peer] = self.pings_sent.get(peer, 0) + 1
        measure = self.on_round_trip is not None and pings % ROUND_TRIP_EVERY_PINGS == 0
        if peer in self.sent_since_ping and not measure:
            self.sent_since_ping.discard(peer)
            return
        connection = self.peers.get(peer)
        if connection is not None and connection.buffered_bytes() <= WRITE_BUFFER_BYTES_MAX:
            if measure:
                connection.write(wire.PeerPing(sent_ns=time.monotonic_ns()))
            else:
                connection.write(wire.PeerBatch(envelopes=[]))

    def round_trip_frame(
        self, connection: Connection, frame: wire.PeerPing | wire.PeerPong
    ) -> None:
        """A ping is answered at once; a pong ends a round trip we measured."""
        peer = connection.peer_id
        if peer is None:
            return
        if self.on_peer_heard is not None:
            self.on_peer_heard(peer)
        if isinstance(frame, wire.PeerPing):
            connection.write(wire.PeerPong(sent_ns=frame.sent_ns))
        elif self.on_round_trip is not None:
            self.on_round_trip(peer, max(0, time.monotonic_ns() - frame.sent_ns) / 1e9)

    def send_groups_down(self, peer: str, node_id: str, groups: list[str]) -> None:
        """Tell `peer` these groups stopped on this node (best effort: a peer not connected
        now hears nothing of this node, and its liveness wakes its quiet groups anyway)."""
        connection = self.peers.get(peer)
        if connection is not None:
            connection.write(wire.PeerBatch(envelopes=[], down_node=node_id, down_groups=groups))

    def write_batches(
        self,
        connection: Connection,
        envelopes: list[wire.RaftEnvelope],
        heartbeats: list[HeartbeatRow] | None = None,
        answers: list[HeartbeatAnswerRow] | None = None,
    ) -> None:
        """One frame if it fits; otherwise halves, until each fits (a message too large
        even alone is dropped and counted: Raft sends it again, smaller or never). Rows
        that do not fit beside the envelopes go in frames of their own."""
        if heartbeats or answers:
            batch = wire.PeerBatch(
                envelopes=envelopes,
                source=self.node_id,
                heartbeats=heartbeats or [],
                heartbeat_answers=answers or [],
            )
            payload = wire.encode(batch)
            if len(payload) <= self.frame_bytes_max:
                connection.write_payload(payload)
                return
            self.write_rows(connection, heartbeats or [], answers or [])
            if envelopes:
                self.write_batches(connection, envelopes)
            return
        payload = wire.encode(wire.PeerBatch(envelopes=envelopes))
        if len(payload) <= self.frame_bytes_max:
            connection.write_payload(payload)
        elif len(envelopes) > 1:
            middle = len(envelopes) // 2
            self.write_batches(connection, envelopes[:middle])
            self.write_batches(connection, envelopes[middle:])
        else:
            self.dropped_messages += 1
            log.error("dropping a %d-byte Raft message over frame_bytes_max", len(payload))

    def write_rows(
        self,
        connection: Connection,
        heartbeats: list[HeartbeatRow],
        answers: list[HeartbeatAnswerRow],
    ) -> None:
        """Rows alone, halved until each frame fits (a row is a few dozen bytes)."""
        batch = wire.PeerBatch(
            envelopes=[], source=self.node_id, heartbeats=heartbeats, heartbeat_answers=answers
        )
        payload = wire.encode(batch)
        if len(payload) <= self.frame_bytes_max:
            connection.write_payload(payload)
        elif len(heartbeats) > 1 or (heartbeats and answers):
            # Halve the heartbeats (all of them to one side when there is one), so each
            # half is smaller than the whole: one heartbeat and one answer split in two.
            middle = max(len(heartbeats) // 2, 1)
            self.write_rows(connection, heartbeats[:middle], [])
            self.write_rows(connection, heartbeats[middle:], answers)
        elif len(answers) > 1:
            middle = len(answers) // 2
            self.write_rows(connection, [], answers[:middle])
            self.write_rows(connection, [], answers[middle:])
        else:
            self.dropped_messages += 1

    async def close(self) -> None:
        self.stopping = True
        dialers = [*self.dialers.values(), *self.retired_dialers]
        for task in dialers:
            task.cancel()
        for task in dialers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.server is not None:
            self.server.close()
        await self.stop_accepting()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        if self.server is not None:
            await self.server.wait_closed()

    async def stop_accepting(self) -> None:
        tasks = [*self.admitting, *([self.accepting] if self.accepting is not None else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.listening_socket is not None:
            self.listening_socket.close()


class OutgoingRows:
    """Rows queued for one peer until the next flush."""

    __slots__ = ("answers", "heartbeats")

    def __init__(self) -> None:
        self.heartbeats: list[HeartbeatRow] = []
        self.answers: list[HeartbeatAnswerRow] = []

    def count(self) -> int:
        return len(self.heartbeats) + len(self.answers)

    def envelopes(self, source: str, target: str) -> list[wire.RaftEnvelope]:
        """The rows as the envelopes they stand for (for a peer that reads no rows)."""
        return [
            *(
                wire.RaftEnvelope(group=row.group, message=push_of(row, source, target))
                for row in self.heartbeats
            ),
            *(
                wire.RaftEnvelope(group=row.group, message=answer_of(row, source, target))
                for row in self.answers
            ),
        ]


def listening_socket(host: str, port: int) -> socket.socket:
    """A non-blocking listening socket on `host:port` (a wildcard host: every address)."""
    family, _, _, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.create_server(address, family=family, backlog=LISTEN_BACKLOG)
    listener.setblocking(False)
    return listener


async def first_byte(loop: asyncio.AbstractEventLoop, accepted: socket.socket) -> int | None:
    """The first byte the other end sent, left unread; None if it closed first."""
    readable: asyncio.Future[None] = loop.create_future()
    descriptor = accepted.fileno()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(descriptor, wake)
    try:
        await readable
    finally:
        loop.remove_reader(descriptor)
    peeked = accepted.recv(1, socket.MSG_PEEK)
    return peeked[0] if peeked else None


def describe_socket(accepted: socket.socket) -> str:
    try:
        peer = accepted.getpeername()
    except OSError:
        return "?"
    return f"{peer[0]}:{peer[1]}"
