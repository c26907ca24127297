"""`AsyncioHALinks`: the broker hosts' `HALinks` on a node's event loop.

The HA channel has its own listener (one port per node, any free port, on the host the node
listens on), not the client port: HA frames are a different protocol (ha/wire.py, with its
own decoder) between brokers, and a listener of their own keeps them out of the client
dispatcher. Every connection starts with one `HAConnectionHello` frame from the opening
side naming the cluster and the broker group, so one listener serves every group hosted on
the node; then `ha.wire` frames follow, each length-prefixed (codec/frame.py).

Events reach the group's `BrokerHost` from asyncio's protocol callbacks, so never from
inside a call the host made. A connection that breaks, or sends a frame that does not
decode, is closed and reported with `connection_lost`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import cast

import msgspec

from quorumlog.codec.frame import FRAME_HEADER, FrameDecoder, FrameError
from quorumlog.ha.broker_host import BrokerHost
from quorumlog.ha.wire import HAFrame, decode_frame, encode_frame
from quorumlog.kv.connection import parse_endpoint
from quorumlog.tls.config import NodeTLS, server_context
from quorumlog.tls.handshake import check_peer_certificate, create_connection

log = logging.getLogger("quorumlog.ha.links")

CONNECT_TIMEOUT_SECONDS = 3.0


class HAConnectionHello(msgspec.Struct, frozen=True, array_like=True):
    cluster_id: str
    group: str


_hello_decoder = msgspec.msgpack.Decoder(HAConnectionHello)


class AsyncioHALinks:
    """The node's HA listener and connections, shared by the broker hosts it runs."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, cluster_id: str, tls: NodeTLS | None = None
    ) -> None:
        """`tls`: the node's TLS; brokers are peers, held to the peer rules both ways."""
        self.loop = loop
        self.cluster_id = cluster_id
        self.tls = tls or NodeTLS()
        self.hosts: dict[str, BrokerHost] = {}
        """Broker group -> its host on this node."""
        self.connections: dict[int, HAConnection] = {}
        self.connection_ids = itertools.count(1)
        self.server: asyncio.Server | None = None

    async def listen(self, host: str) -> int:
        """Start listening (any free port); returns the port."""
        self.server = await self.loop.create_server(
            lambda: HAConnection(self, None),
            host,
            0,
            ssl=server_context(self.tls) if self.tls.enabled else None,
        )
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    def for_group(self, group: str) -> GroupLinks:
        return GroupLinks(self, group)

    def attach(self, host: BrokerHost) -> None:
        self.hosts[host.group] = host

    def detach(self, group: str) -> None:
        self.hosts.pop(group, None)
        for connection in list(self.connections.values()):
            if connection.group == group:
                connection.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections.values()):
            connection.close()
        self.hosts.clear()


class GroupLinks:
    """`HALinks` of one broker group's host."""

    def __init__(self, links: AsyncioHALinks, group: str) -> None:
        self.links = links
        self.group = group

    def connect(self, address: str) -> int:
        links = self.links
        connection = HAConnection(links, self.group)
        links.connections[connection.connection_id] = connection
        connection.task = links.loop.create_task(connection.connect(address))
        return connection.connection_id

    def send(self, connection_id: int, frame: HAFrame) -> None:
        connection = self.links.connections.get(connection_id)
        if connection is not None:
            connection.write(encode_frame(frame))

    def close(self, connection_id: int) -> None:
        connection = self.links.connections.get(connection_id)
        if connection is not None:
            connection.close()


class HAConnection(asyncio.Protocol):
    """One connection: opened to a master (`group` known) or accepted (group from hello)."""

    def __init__(self, links: AsyncioHALinks, group: str | None) -> None:
        self.links = links
        self.group = group
        self.outgoing = group is not None
        self.connection_id = next(links.connection_ids)
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False

    async def connect(self, address: str) -> None:
        try:
            host, port = parse_endpoint(address)
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                await create_connection(
                    self.links.loop, lambda: self, host, port, self.links.tls.dialing_tls()
                )
        except (OSError, TimeoutError, ValueError) as error:
            self.fail(f"cannot connect to {address}: {error}")

    def host(self) -> BrokerHost | None:
        return None if self.group is None else self.links.hosts.get(self.group)

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.closed:
            transport.close()
            return
        self.transport = cast(asyncio.Transport, transport)
        if not self.outgoing:
            problem = check_peer_certificate(transport, self.links.tls)
            if problem is not None:
                log.warning("refusing an HA connection: %s", problem)
                self.transport.abort()
                return
            self.links.connections[self.connection_id] = self
            return
        assert self.group is not None
        hello = HAConnectionHello(self.links.cluster_id, self.group)
        self.write(msgspec.msgpack.encode(hello))
        host = self.host()
        if host is not None:
            host.connected(self.connection_id)

    def data_received(self, data: bytes) -> None:
        try:
            for payload in self.decoder.feed(data):
                if self.closed:
                    return
                self.take(payload)
        except FrameError as error:
            self.fail(f"bad frame: {error}")
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            self.fail(f"undecodable frame: {error}")

    def take(self, payload: bytes) -> None:
        if self.group is None:
            hello = _hello_decoder.decode(payload)
            if hello.cluster_id != self.links.cluster_id or hello.group not in self.links.hosts:
                self.fail(f"hello for {hello.cluster_id}/{hello.group}: not served here")
                return
            self.group = hello.group
            return
        host = self.host()
        if host is None:
            self.fail(f"no broker of {self.group} here")
            return
        host.frame_received(self.connection_id, decode_frame(payload))

    def connection_lost(self, error: Exception | None) -> None:
        self.fail(f"lost: {error}" if error else "closed by the other side")

    # --- writing and closing ---------------------------------------------------------------

    def write(self, payload: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.writelines((FRAME_HEADER.pack(len(payload)), payload))

    def close(self) -> None:
        """Closed by the host: no event follows."""
        if self.closed:
            return
        self.closed = True
        self.links.connections.pop(self.connection_id, None)
        if self.transport is not None:
            self.transport.abort()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def fail(self, reason: str) -> None:
        if self.closed:
            return
        log.info("HA connection %d (%s) dropped: %s", self.connection_id, self.group, reason)
        host = self.host()
        self.close()
        if host is not None:
            host.connection_lost(self.connection_id)


__all__ = ["AsyncioHALinks", "GroupLinks", "HAConnection", "HAConnectionHello"]
