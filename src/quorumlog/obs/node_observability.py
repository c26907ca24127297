"""A node's observability, composed in one object the node owns: its events, metrics and
HTTP endpoint (`/metrics`, `/health`, `/readyz`, `/livez`, `/api/status`, `/`).

The node asks for each group's host hooks (`hooks_for`) before building the group and
attaches the group's core once it is built (`attach`); the transport reports peer links
to `events.peer_link`. `serve_http` starts the HTTP server on the node's own event loop;
every page reads the node through `NodeView`, on that loop, when asked.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from quorumlog.obs.dashboard import consumer_groups_view, page_html, status_view
from quorumlog.obs.events import EventLog, GroupObserver
from quorumlog.obs.health import HealthVerdict, check_health, check_liveness
from quorumlog.obs.http_server import HttpServer, Response, json_response
from quorumlog.obs.metrics import CONTENT_TYPE, NodeMetrics
from quorumlog.obs.topic_traffic import TopicTraffic
from quorumlog.runtime.group import GroupRunner
from quorumlog.runtime.transport import format_address, parse_address

if TYPE_CHECKING:
    from quorumlog.node.server import Node

log = logging.getLogger("quorumlog.obs")

SLOW_FSYNC_WARN_MS_DEFAULT = 1000


class Observability:
    def __init__(self, node_id: str, slow_fsync_warn_ms: int = SLOW_FSYNC_WARN_MS_DEFAULT) -> None:
        self.node_id = node_id
        self.slow_sync_seconds = slow_fsync_warn_ms / 1000
        self.events = EventLog(node_id)
        self.metrics = NodeMetrics()
        self.group_observers: dict[str, GroupObserver] = {}
        self.topic_traffic = TopicTraffic()
        self.http: HttpServer | None = None
        self.http_address = ""

    def hooks_for(self, group: str) -> GroupObserver:
        observer = GroupObserver(group, self.events, self.slow_sync_seconds, self.metrics.synced)
        self.group_observers[group] = observer
        return observer

    def attach(self, group: str, runner: GroupRunner) -> None:
        self.group_observers[group].attach(runner.core)

    def forget(self, group: str, topic: str | None = None) -> None:
        """A group (and its topic) is no longer hosted here: its series go."""
        self.group_observers.pop(group, None)
        if topic is not None:
            self.topic_traffic.forget(topic)

    async def serve_http(self, listen: str, node: Node) -> str:
        """Serve the pages on `listen` (HOST:PORT, port 0: any free one); the address."""
        view = NodeView(node)
        self.metrics.watch(view)
        self.http = HttpServer(
            {
                "/metrics": lambda: metrics_page(self.metrics),
                "/health": lambda: health_page(view),
                "/readyz": lambda: health_page(view),
                "/livez": lambda: liveness_page(view),
                "/api/status": lambda: status_page(view),
                "/": dashboard_page,
            }
        )
        host, port = parse_address(listen)
        bound = await self.http.start(host, port)
        self.http_address = format_address(host, bound)
        log.info(
            "node %s serves metrics and its dashboard at http://%s/",
            self.node_id,
            self.http_address,
        )
        return self.http_address

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()


class NodeView:
    """What the pages read of a node, in one place (the node's own layout stays its own)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.node_id = node.node_id

    @property
    def groups(self) -> Mapping[str, GroupRunner]:
        return self.node.groups

    @property
    def group_observers(self) -> Mapping[str, GroupObserver]:
        return self.node.observability.group_observers

    @property
    def peer_bytes_sent(self) -> Mapping[str, int]:
        return self.node.endpoint.peer_bytes_sent

    @property
    def peer_bytes_received(self) -> Mapping[str, int]:
        return self.node.endpoint.peer_bytes_received

    @property
    def topic_traffic(self) -> TopicTraffic:
        return self.node.observability.topic_traffic

    @property
    def addresses(self) -> dict[str, str]:
        return self.node.addresses

    @property
    def events(self) -> EventLog:
        return self.node.observability.events

    def peer_reachable(self, peer: str) -> bool:
        return self.node.liveness.is_reachable(peer) and peer in self.node.endpoint.peers

    def metadata(self) -> Mapping[str, Any]:
        kv = self.node.kv
        return kv.machine.data if kv is not None else {}

    def committed_offsets(self) -> list[tuple[str, str, int, int]]:
        coordinator = getattr(self.node, "group_coordinator", None)
        if coordinator is None:
            return []
        return [
            (info.group, offset.topic, offset.partition, offset.offset)
            for info in coordinator.machine.list_groups()
            for offset in info.offsets
        ]

    def partition_end_offset(self, topic: str, partition: int) -> int | None:
        streams = getattr(self.node, "streams", None)
        if streams is None:
            return None
        hosted = streams.partitions.get((topic, partition))
        return hosted.machine.next_offset if hosted is not None else None

    def partition_leader_here(self, topic: str, partition: int) -> bool:
        streams = getattr(self.node, "streams", None)
        hosted = streams.partitions.get((topic, partition)) if streams is not None else None
        return hosted is not None and hosted.group.host.is_leader

    def consumer_lags(self) -> list[tuple[str, str, int, int]]:
        return [
            (group["group"], row["topic"], row["partition"], row["lag"])
            for group in consumer_groups_view(self)
            for row in group["partitions"]
            if row["lag"] is not None and self.partition_leader_here(row["topic"], row["partition"])
        ]

    def ha_confirm_lags(self) -> list[tuple[str, int, int]]:
        streams = getattr(self.node, "streams", None)
        if streams is None:
            return []
        return [
            (topic, partition, max(0, part.commit_log.max_offset - part.host.confirm_offset))
            for (topic, partition), part in sorted(streams.ha_topics.partitions.items())
            if part.host.is_master
        ]

    def bookie_state(self) -> tuple[int, bool] | None:
        server = self.node.bookie
        if server is None:
            return None
        return server.bookie.syncs_completed, server.writable

    async def health(self) -> HealthVerdict:
        return await check_health(self.node.groups, self.node.peers, self.node.metadata_endpoints)


async def metrics_page(metrics: NodeMetrics) -> Response:
    return Response(200, metrics.exposition(), CONTENT_TYPE)


async def health_page(view: NodeView) -> Response:
    verdict = await view.health()
    return json_response(verdict.body(), 200 if verdict.healthy else 503)


async def liveness_page(view: NodeView) -> Response:
    verdict = check_liveness(view.groups)
    return json_response(verdict.body(), 200 if verdict.healthy else 503)


async def status_page(view: NodeView) -> Response:
    body = json.dumps(status_view(view, lambda: int(time.time() * 1000)), default=str)
    return Response(200, body.encode(), "application/json")


async def dashboard_page() -> Response:
    return Response(200, page_html(), "text/html; charset=utf-8")
