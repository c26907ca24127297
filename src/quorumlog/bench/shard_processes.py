"""Processes and requests for `quorumlog bench shard`: node processes hosting the shard
controller and shard groups, and blocking controller and status requests to them.

Every request goes on a fresh connection (one handshake, one request, one answer): the
driver asks rarely, and a fresh connection never carries a stale answer of an earlier
request that timed out.
"""

from __future__ import annotations

import time
from pathlib import Path

from quorumlog.bench import kv_processes
from quorumlog.bench.kv_processes import POLL_INTERVAL_SECONDS, BenchError, NodeCluster
from quorumlog.codec.wire import (
    ClientRequest,
    ControllerRequest,
    ControllerResponse,
    ErrorCode,
    ErrorResponse,
    Frame,
    ShardStatusRequest,
    ShardStatusResponse,
)
from quorumlog.shard.config import ShardConfiguration
from quorumlog.shard.controller_commands import (
    ControllerCommand,
    ControllerResult,
    Query,
    decode_results,
    encode_commands,
)

REQUEST_TIMEOUT_SECONDS = 5.0
CONTROLLER_TIMEOUT_SECONDS = 30.0
RETRY_CODES = frozenset(
    {ErrorCode.NOT_LEADER, ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT, ErrorCode.PENDING_FULL}
)
"""Answers after which the same request goes to the next node (no leader there, yet)."""


class ShardNodeCluster(NodeCluster):
    """`NodeCluster` whose nodes all host the controller and every shard group."""

    def __init__(
        self,
        directory: Path,
        cluster_id: str,
        group_count: int,
        shard_count: int,
        node_arguments: list[str] | None = None,
    ) -> None:
        super().__init__(directory, node_count=3, cluster_id=cluster_id)
        self.group_count = group_count
        self.shard_count = shard_count
        self.node_arguments = list(node_arguments or [])
        """Extra `quorumlog node` flags for every node (e.g. the migration throttle)."""

    @property
    def gids(self) -> list[int]:
        return list(range(1, self.group_count + 1))

    def extra_node_arguments(self, node_id: str) -> list[str]:
        """Host the controller and every shard group on this node."""
        node_ids = ",".join(self.addresses)
        arguments = ["--controller", node_ids, "--shard-count", str(self.shard_count)]
        for gid in self.gids:
            arguments += ["--shard-group", f"{gid}={node_ids}"]
        return arguments + self.node_arguments


def request_once(
    address: str, cluster_id: str, request: ClientRequest, timeout_seconds: float
) -> Frame | None:
    """The node's answer to `request` on a fresh connection; None if it gives none in time."""
    return kv_processes.request_once(
        address, cluster_id, request, timeout_seconds, "bench-shard-admin"
    )


class ControllerAdmin:
    """Join, leave, move and query through the controller group, as one client."""

    def __init__(self, endpoints: list[str], cluster_id: str, client_id: str) -> None:
        self.endpoints = endpoints
        self.cluster_id = cluster_id
        self.client_id = client_id
        self.sequence = 0
        self.request_id = 0

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    def run(self, command: ControllerCommand) -> ControllerResult:
        """Send until a controller leader answers; retries reuse the command's sequence,
        so the controller applies it once."""
        deadline = time.monotonic() + CONTROLLER_TIMEOUT_SECONDS
        last_answer: Frame | None = None
        while time.monotonic() < deadline:
            for address in self.endpoints:
                self.request_id += 1
                answer = request_once(
                    address,
                    self.cluster_id,
                    ControllerRequest(
                        request_id=self.request_id,
                        client_id=self.client_id,
                        commands=encode_commands([command]),
                    ),
                    REQUEST_TIMEOUT_SECONDS,
                )
                last_answer = answer
                if isinstance(answer, ControllerResponse):
                    [result] = decode_results(answer.results)
                    if not result.ok:
                        raise BenchError(f"controller refused {command}: {result.error}")
                    return result
                if isinstance(answer, ErrorResponse) and answer.code not in RETRY_CODES:
                    raise BenchError(f"controller refused {command}: {answer.message}")
            time.sleep(POLL_INTERVAL_SECONDS)  # no leader yet: the back-off between rounds
        raise BenchError(f"no controller leader answered {command}; last answer {last_answer}")

    def latest(self) -> ShardConfiguration:
        result = self.run(Query(self.next_sequence(), -1))
        if result.configuration is None:
            raise BenchError("a query returned no configuration")
        return result.configuration


def shard_statuses(
    endpoints: list[str], cluster_id: str, gid: int
) -> list[ShardStatusResponse | None]:
    """Each node's view of group `gid` (None where a node does not answer)."""
    statuses: list[ShardStatusResponse | None] = []
    for address in endpoints:
        answer = request_once(
            address, cluster_id, ShardStatusRequest(request_id=1, gid=gid), REQUEST_TIMEOUT_SECONDS
        )
        statuses.append(answer if isinstance(answer, ShardStatusResponse) else None)
    return statuses


def group_settled(status: ShardStatusResponse | None, number: int) -> bool:
    """The replica applied configuration `number` (or later) and serves every shard it has."""
    return (
        status is not None
        and status.configuration_number >= number
        and all(state == "serving" for state in status.shard_states.values())
    )


def wait_settled(
    endpoints: list[str], cluster_id: str, gids: list[int], number: int, timeout_seconds: float
) -> None:
    """Wait until every replica of every group in `gids` settled at `number`."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        if all(
            group_settled(status, number)
            for gid in gids
            for status in shard_statuses(endpoints, cluster_id, gid)
        ):
            return
        if time.monotonic() >= deadline:
            raise BenchError(f"groups {gids} did not settle at configuration {number}")
        time.sleep(POLL_INTERVAL_SECONDS)
