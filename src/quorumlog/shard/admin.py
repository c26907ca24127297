"""ShardAdmin: the blocking administration client of the sharded KV.

    from quorumlog import ShardAdmin

    with ShardAdmin(["127.0.0.1:2379"]) as admin:  # the shard controller's nodes
        admin.join({1: ["n1", "n2", "n3"]})  # node ids (or "host:port" addresses)
        admin.query()  # the latest ShardConfiguration
        admin.status()  # per group: its leader and the state of each shard it holds

Join, leave and move go through the controller's log; each carries this admin's client id
and a sequence, so a retry after a lost answer is deduplicated by the controller and the
change happens once. A call that ended in UnknownOutcomeError and is repeated with the same
arguments within `timeout` seconds reuses its sequence, as KV writes do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import msgspec

from quorumlog.auth.credentials import credentials_source
from quorumlog.codec.wire import ShardStatusRequest, ShardStatusResponse
from quorumlog.errors import ClientError, QuorumLogError
from quorumlog.kv.client import tracked_sequence
from quorumlog.kv.connection import (
    CLUSTER_ID_DEFAULT,
    EndpointSelector,
    RequestAttempts,
    describe,
)
from quorumlog.shard.client import (
    QUERY_LATEST,
    ControllerClient,
    ShardRouter,
    resolve_servers,
)
from quorumlog.shard.config import UNASSIGNED_GID, ShardConfiguration
from quorumlog.shard.controller_commands import ControllerCommand, Join, Leave, Move
from quorumlog.tls.config import TLSConfig

STATUS_TIMEOUT_SECONDS_MAX = 2.0
"""How long status waits for one replica: a replica that is down should not hold up the
view of the others for the whole timeout."""
UNASSIGNED_STATE = "unassigned"
UNKNOWN_STATE = "unknown"


class GroupStatus(msgspec.Struct, frozen=True):
    """One shard group as its leader sees it (or its most advanced replica, without one)."""

    gid: int
    servers: list[str]
    leader: str | None
    """The leader's address, if any replica knows it."""
    configuration_number: int | None
    """The configuration the group has reached; None if no replica answered."""
    shard_states: dict[int, str]
    """shard → "serving", "pulling", "be_pulling" or "garbage_collecting"."""
    stored_keys: int | None
    errors: list[str]
    """One line per replica that did not answer."""


class ShardRow(msgspec.Struct, frozen=True):
    """One line of `quorumlog shard status`: a shard held by a group."""

    shard: int
    gid: int
    state: str
    leader: str | None


class ShardClusterStatus(msgspec.Struct, frozen=True):
    configuration: ShardConfiguration
    groups: list[GroupStatus]

    def rows(self) -> list[ShardRow]:
        return shard_rows(self.configuration, self.groups)


def shard_rows(configuration: ShardConfiguration, groups: list[GroupStatus]) -> list[ShardRow]:
    """A row per shard for its owner in `configuration`, plus a row for each copy another
    group still holds (being pulled from it, or waiting for deletion); by shard, then gid."""
    by_gid = {group.gid: group for group in groups}
    rows: list[ShardRow] = []
    for shard, owner in enumerate(configuration.shards):
        group = by_gid.get(owner)
        if owner == UNASSIGNED_GID or group is None:
            rows.append(ShardRow(shard, owner, UNASSIGNED_STATE, None))
            continue
        state = group.shard_states.get(shard, UNKNOWN_STATE)
        rows.append(ShardRow(shard, owner, state, group.leader))
    for group in groups:
        for shard, state in group.shard_states.items():
            if shard < configuration.shard_count and configuration.shards[shard] != group.gid:
                rows.append(ShardRow(shard, group.gid, state, group.leader))
    return sorted(rows, key=lambda row: (row.shard, row.gid))


def group_status(
    gid: int, servers: list[str], answers: list[ShardStatusResponse], errors: list[str]
) -> GroupStatus:
    """Summarise the replicas' answers: the leader's view, else the most advanced one's."""
    if not answers:
        return GroupStatus(gid, servers, None, None, {}, None, errors)
    best = max(answers, key=lambda answer: (answer.is_leader, answer.configuration_number))
    leader = best.leader or next((a.leader for a in answers if a.leader is not None), None)
    return GroupStatus(
        gid,
        servers,
        leader,
        best.configuration_number,
        dict(sorted(best.shard_states.items())),
        best.stored_keys,
        errors,
    )


class ShardAdmin(ControllerClient):
    """Join, leave, move and query through the shard controller; status from the groups."""

    closed_message = "the admin client is closed"

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
        super().__init__(
            endpoints,
            timeout,
            cluster_id,
            client_id or f"admin-{uuid.uuid4().hex}",
            attempt_timeout_seconds,
            credentials_source(user, password),
            tls,
        )

    # --- controller commands ------------------------------------------------------------

    def join(self, groups: dict[int, list[str]]) -> int:
        """Add groups (gid → servers); returns the new configuration number.

        Name servers by node id where you can: the cluster looks up where a node id
        listens each time, while an address goes stale if the node restarts elsewhere."""
        identity = ("join", repr(sorted(groups.items())), None, None)
        return self.change(
            f"join {sorted(groups)}", identity, lambda sequence: Join(sequence, groups)
        )

    def leave(self, gids: list[int]) -> int:
        """Remove groups; their shards go to the others. Returns the configuration number."""
        identity = ("leave", repr(sorted(gids)), None, None)
        return self.change(
            f"leave {sorted(gids)}", identity, lambda sequence: Leave(sequence, gids)
        )

    def move(self, shard: int, gid: int) -> int:
        """Give `shard` to group `gid`; returns the new configuration number."""
        identity = ("move", str(shard), str(gid), None)
        return self.change(
            f"move shard {shard} to {gid}", identity, lambda sequence: Move(sequence, shard, gid)
        )

    def query(self, number: int = QUERY_LATEST) -> ShardConfiguration:
        """Configuration `number` (-1: the latest)."""
        with self.lock:
            self.check_open()
            return self.controller.query(number)

    def change(
        self,
        what: str,
        identity: tuple[str, str, str | None, str | None],
        make_command: Callable[[int], ControllerCommand],
    ) -> int:
        """Send one change through the controller's log, with this admin's next sequence
        (or the one held for the same change after an unknown outcome)."""
        with self.lock:
            self.check_open()
            with tracked_sequence(self.sequences, identity) as sequence:
                result = self.controller.send(
                    what,
                    make_command(sequence),
                    side_effects=True,
                    first_unacknowledged=self.sequences.first_unacknowledged(),
                )
            if result.configuration_number is None:
                # A duplicate whose result the controller already forgot: it did happen.
                return self.controller.query(QUERY_LATEST).number
            return result.configuration_number

    # --- status -------------------------------------------------------------------------

    def status(self) -> ShardClusterStatus:
        """The latest configuration and, for each of its groups, what its replicas report."""
        with self.lock:
            self.check_open()
            configuration = self.controller.query(QUERY_LATEST)
            router = ShardRouter()
            router.learn(configuration)
            self.refresh_addresses(router, self.timeout)
            groups = [
                self.group_status(gid, servers, router.addresses)
                for gid, servers in configuration.groups.items()
            ]
            return ShardClusterStatus(configuration, groups)

    def group_status(
        self, gid: int, servers: list[str], addresses: dict[str, str] | None = None
    ) -> GroupStatus:
        """What each of `servers` reports (node ids are looked up in `addresses`)."""
        answers: list[ShardStatusResponse] = []
        errors: list[str] = []
        for server in servers:
            try:
                endpoints = resolve_servers([server], addresses or {})
                if not endpoints:
                    raise ClientError("no known address")
                answers.append(self.replica_status(gid, endpoints[0]))
            except QuorumLogError as error:
                errors.append(f"{server}: {describe(error)}")
        return group_status(gid, servers, answers, errors)

    def replica_status(self, gid: int, server: str) -> ShardStatusResponse:
        attempts = RequestAttempts(
            f"status of group {gid} at {server}",
            EndpointSelector([server]),
            time.monotonic,
            min(self.timeout, STATUS_TIMEOUT_SECONDS_MAX),
            self.transport.attempt_timeout_seconds,
            side_effects=False,
            fixed_endpoint=server,
        )
        response = self.transport.call(
            attempts,
            lambda request_id: ShardStatusRequest(request_id=request_id, gid=gid),
            ShardStatusResponse,
            at_leader=False,
        )
        if response is None:
            raise attempts.give_up_error()
        return response


__all__ = ["GroupStatus", "ShardAdmin", "ShardClusterStatus", "ShardRow", "shard_rows"]
