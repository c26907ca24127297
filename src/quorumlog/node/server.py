"""One node process: the endpoint (listener + peer links) and the Raft groups it hosts.

Every group shares the one endpoint; messages carry their group's name.

- "kv": the replicated KV, which also holds stream metadata (`KVService`);
- "<topic>@<created>/<partition>": stream partitions this node replicates (`StreamService`);
- "controller": the shard controller, on the nodes in `controller` (`ControllerService`);
- "ha-controller": the HA controller of controller mode (reference 003), with the same
  bootstrap members as "kv" unless `ha_controller` is off (`HAControllerService`);
- "shard-<gid>": the shard groups this node is a member of (`ShardGroupService`), each with
  a `ShardMigrator` moving shards while it leads, and `PreferredLeaders` spreading their
  leaders over the nodes.

Unless started with `bookie=False`, a node also hosts a bookie (`BookieServer`, data in
`data_dir/bookie`, id = the node id, reached at the node's client address) and keeps its
registration in the "kv" group fresh (`BookieRegistrar`).

Which service answers a client request is `node/dispatch.py`'s `RequestDispatcher`; the
sharded KV's services, migrators and preferred leaders are put together by
`node/composition.py` (the simulator composes its nodes with the same two).

All groups tick from one `GroupTicker` (runtime/ticker.py), which skips quiet groups, and
one `PeerLiveness` (runtime/liveness.py) per node tells quiet groups when a peer's node
falls silent: an idle node costs next to nothing whatever number of groups it hosts. The
same liveness lets a busy node's followers hold an election while their leader's node is
heard (`RaftConfig.leader_node_hold_ticks`): a late heartbeat from a live, busy node is
no reason to depose it.

Where the other nodes listen is kept in an `AddressBook` (`node/addresses.py`, which says
which source of an address wins): this node's own address, what peers announce in their
handshakes, `--peers`, and — only to fill gaps — addresses stored in the logs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from quorumlog.auth.commands import read_switch
from quorumlog.auth.credentials import Credentials
from quorumlog.auth.guard import TOKEN_TTL_SECONDS_DEFAULT, AuthGuard
from quorumlog.auth.model import NODE_USER
from quorumlog.auth.service import AuthRequestService
from quorumlog.auth.state import AuthStateView
from quorumlog.codec import wire
from quorumlog.codec.feature_levels import BASELINE_FEATURE_LEVEL
from quorumlog.codec.heartbeat_rows import answer_of, push_of, row_of
from quorumlog.errors import QuorumLogError
from quorumlog.ha.controller_machine import BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT, HAControllerMachine
from quorumlog.kv.connection import parse_endpoint
from quorumlog.kv.machine import KVStateMachine
from quorumlog.ledger.bookie_garbage import (
    GARBAGE_INTERVAL_SECONDS_DEFAULT,
    BookieGarbageCollector,
    GarbageSettings,
)
from quorumlog.ledger.bookie_registration import BookieRegistrar, RegistrationSettings
from quorumlog.ledger.bookie_server import BookieServer
from quorumlog.ledger.registry import BOOKIE_HEARTBEAT_SECONDS
from quorumlog.node.addresses import AddressBook, AddressSource, check_advertised
from quorumlog.node.cluster_level import CommittedLevelFile, PeerLevels
from quorumlog.node.composition import ShardedKVLayout, ShardedKVParts, compose_sharded_kv
from quorumlog.node.controller_service import ControllerService
from quorumlog.node.dispatch import KV_GROUP, RequestDispatcher
from quorumlog.node.group_coordinator_service import GroupCoordinatorService
from quorumlog.node.ha_controller_service import (
    CHECK_INTERVAL_SECONDS_DEFAULT,
    HAControllerService,
)
from quorumlog.node.kv_service import KVLimits, KVService
from quorumlog.node.ledger_sweep import SWEEP_INTERVAL_SECONDS_DEFAULT
from quorumlog.node.offsets_import import KVPreviousOffsets
from quorumlog.node.peer_requests import AsyncioPeerRequests, PeerRequester
from quorumlog.node.preferred_leaders import PreferredLeaders
from quorumlog.node.shard_migration import (
    MIGRATION_BYTES_PER_SECOND_DEFAULT,
    PULL_BYTES_MAX_DEFAULT,
    ByteRatePacer,
    ShardMigrator,
)
from quorumlog.node.shard_service import ShardGroupService
from quorumlog.node.stream_service import StreamService, TopicWatchingMachine
from quorumlog.obs.node_observability import SLOW_FSYNC_WARN_MS_DEFAULT, Observability
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.messages import Message
from quorumlog.runtime.group import AsyncioScheduler, GroupRunner, GroupSettings, StateMachine
from quorumlog.runtime.host import RaftHost
from quorumlog.runtime.liveness import PeerLiveness
from quorumlog.runtime.sync_batch import BatchedBackground
from quorumlog.runtime.ticker import GroupTicker
from quorumlog.runtime.transport import Endpoint, Replier, format_address, parse_address
from quorumlog.shard.config import SHARD_COUNT_DEFAULT
from quorumlog.stream.group_coordinator import GroupCoordinatorMachine
from quorumlog.tls.config import NodeTLS

log = logging.getLogger("quorumlog.node")


class NodeSettings(msgspec.Struct, frozen=True):
    node_id: str
    listen: str
    """HOST:PORT to listen on (port 0: any free port)."""
    data_dir: str
    peers: dict[str, str] = {}
    """Every other member's id and HOST:PORT."""
    cluster_id: str = "quorumlog"
    join: bool = False
    """Start with no membership and wait to be added (`quorumlog member add`)."""
    tick_ms: int = 50
    election_ticks: int = 10
    quiesce_idle_ticks: int = 4
    """An idle group goes quiet after this many ticks (no heartbeats, no ticks); 0: never."""
    fsync: bool = True
    snapshot_entries: int = 20_000
    snapshot_trailing_entries: int = 5_000
    controller: list[str] = []
    """The node ids of the shard controller group's members (empty: no sharded KV)."""
    shard_groups: dict[int, list[str]] = {}
    """Shard group gid → its members' node ids. This node hosts the groups it is in."""
    shard_count: int = SHARD_COUNT_DEFAULT
    """Shards of the sharded KV: fixed for the cluster's life (keys hash to shards)."""
    shard_monitor_ms: int = 100
    """How often a shard group's leader checks for a new configuration and moves shards."""
    shard_pull_bytes_max: int = PULL_BYTES_MAX_DEFAULT
    """Keys and values per pull chunk (one frame and one log entry each)."""
    shard_migration_bytes_per_second: int = MIGRATION_BYTES_PER_SECOND_DEFAULT
    """How fast this node pulls shard data, all its groups together (0: unthrottled)."""
    preferred_leader_ms: int = 1_000
    """How often a shard group's leader checks whether to hand leadership to the group's
    preferred member (spreads leaders over nodes); 0 turns it off."""
    advertise: str = ""
    """HOST:PORT peers and clients should use to reach this node, when not the listen
    address (behind NAT or a proxy); said in every handshake, so peers follow it."""
    bookie: bool = True
    """Host a bookie (ledger storage) in `data_dir/bookie`, registered in the "kv" group."""
    bookie_heartbeat_ms: int = int(BOOKIE_HEARTBEAT_SECONDS * 1000)
    """How often the bookie rewrites its registration."""
    ledger_owner_renew_ms: int = 1_000
    """Ledger topics: how often a partition's owner renews its lease."""
    ledger_owner_stale_ms: int = 3_000
    """Ledger topics: a lease left unrenewed this long is taken over by another replica."""
    ledger_rollover_records: int = 50_000
    """Ledger topics: records per ledger before the owner rolls over to a new ledger."""
    ha_controller: bool = True
    """Host the HA controller group ("ha-controller", members as the "kv" group's)."""
    ha_broker_heartbeat_timeout_ms: int = BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT
    """HA controller: a broker silent this long is dead (its group elects a new master if
    it was the master). The same on every node: replicas decide by it."""
    ha_controller_check_ms: int = int(CHECK_INTERVAL_SECONDS_DEFAULT * 1000)
    """HA controller: how often its leader looks for silent masters."""
    http_listen: str = ""
    """HOST:PORT of the HTTP endpoint (/metrics, /health, the dashboard); empty: none."""
    slow_fsync_warn_ms: int = SLOW_FSYNC_WARN_MS_DEFAULT
    """A log sync or hard-state save slower than this is logged as a slow_fsync event."""
    auth_token_ttl_ms: int = int(TOKEN_TTL_SECONDS_DEFAULT * 1000)
    """Auth: a token unused this long is forgotten (its client authenticates again)."""
    tls: NodeTLS = NodeTLS()
    """TLS for peers and clients (etcd's flags; tls/config.py says what each side uses)."""
    heartbeat_ticks: int = 1
    """A leader's heartbeat interval in ticks (`--heartbeat-interval-ms`; raft_timing.py)."""
    bookie_garbage_interval_ms: int = int(GARBAGE_INTERVAL_SECONDS_DEFAULT * 1000)
    """How often the bookie drops the ledgers whose metadata was deleted (BookKeeper's
    gcWaitTime; ledger/bookie_garbage.py)."""
    ledger_sweep_interval_ms: int = int(SWEEP_INTERVAL_SECONDS_DEFAULT * 1000)
    """Ledger topics: how often the "kv" leader removes what deleted topics left behind
    (node/ledger_sweep.py)."""
    leader_node_hold_election_timeouts: int = 1
    """A follower whose election timeout ran out holds its campaign while its leader's
    node is live (runtime/liveness.py), for at most this many more election timeouts
    (`RaftConfig.leader_node_hold_ticks`); 0: never holds."""
    commit_heartbeat_ticks: int = 2
    """A busy group's follower that lacks only the commit index waits this many ticks
    after its last push for it (`RaftConfig.commit_heartbeat_ticks`, at most
    election_ticks // 5); 0: at the next tick."""


class Node:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        # Each group keeps at most one sync in flight; several groups may sync at once.
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fsync")
        self.auth_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="auth")
        self.sync_background = BatchedBackground()
        """Where every hosted group's syncs run: those of one loop turn go out together."""
        self.address_book = AddressBook(settings.node_id)
        self.address_book.learn_all(dict(settings.peers), AddressSource.OPERATOR)
        settings.tls.validate()
        self.endpoint = Endpoint(
            settings.node_id, settings.cluster_id, settings.peers, self, tls=settings.tls
        )
        self.groups: dict[str, GroupRunner] = {}
        self.kv: KVService | None = None
        self.sharded_kv = ShardedKVParts()
        self.dispatcher = RequestDispatcher(
            settings.node_id, self.host_of, self.address_of, lambda: self.addresses
        )
        self.requester = PeerRequester(
            settings.cluster_id,
            f"node-{settings.node_id}",
            resolve=self.resolve,
            credentials=self.node_credentials,
            tls=settings.tls.dialing_tls(),
        )
        self.peers: AsyncioPeerRequests | None = None
        self.migration_pacer = ByteRatePacer(settings.shard_migration_bytes_per_second)
        self.port = 0
        self.unknown_group_messages = 0
        self.bookie: BookieServer | None = None
        self.registrar: BookieRegistrar | None = None
        self.bookie_garbage: BookieGarbageCollector | None = None
        self.ha_controller: HAControllerService | None = None
        self.group_coordinator: GroupCoordinatorService | None = None
        self.previous_offsets: KVPreviousOffsets | None = None
        self.ticker: GroupTicker | None = None
        self.auth_view: AuthStateView | None = None
        self.liveness = PeerLiveness(
            settings.node_id,
            ping=self.endpoint.ping,
            unreachable=self.peer_unreachable,
            # A peer silent for an election timeout is unreachable; pinged often enough that
            # a live one is heard three times within it (short timeouts in tests too), and no
            # more: pings are most of what an idle node does.
            ping_ticks=max(1, settings.election_ticks // 3),
            silent_ticks_max=max(settings.election_ticks, 2),
            reachable=self.peer_reachable,
        )
        self.endpoint.on_peer_heard = self.liveness.heard
        self.observability = Observability(settings.node_id, settings.slow_fsync_warn_ms)
        self.endpoint.on_peer_link = self.observability.events.peer_link
        self.endpoint.on_round_trip = self.observability.metrics.round_trip
        self.level_file = CommittedLevelFile(Path(settings.data_dir))
        self.committed_level = BASELINE_FEATURE_LEVEL
        """The highest feature level this node knows was committed (codec/feature_levels)."""
        self.peer_levels = PeerLevels(settings.node_id, committed=lambda: self.committed_level)
        self.endpoint.on_peer_level = self.peer_levels.heard
        self.dispatcher.cluster_level = lambda: self.committed_level

    def raft_config(self) -> RaftConfig:
        """The Raft settings of every group this node hosts."""
        settings = self.settings
        return RaftConfig(
            node_id=settings.node_id,
            election_ticks=settings.election_ticks,
            heartbeat_ticks=settings.heartbeat_ticks,
            quiesce_idle_ticks=settings.quiesce_idle_ticks,
            leader_node_hold_ticks=(
                settings.leader_node_hold_election_timeouts * settings.election_ticks
            ),
            commit_heartbeat_ticks=min(
                settings.commit_heartbeat_ticks, settings.election_ticks // 5
            ),
        )

    def peer_unreachable(self, peer: str) -> None:
        """Liveness lost `peer`: quiet groups with that member wake (see raft/core.py)."""
        for group in list(self.groups.values()):
            group.host.peer_unreachable(peer)

    def peer_reachable(self, peer: str) -> None:
        """Liveness hears `peer` again: followers it woke give their leader another
        election timeout (see raft/core.py `peer_reachable`)."""
        for group in list(self.groups.values()):
            group.host.peer_reachable(peer)

    async def start(self) -> int:
        """Open storage, start listening; returns the port bound."""
        settings = self.settings
        check_advertised(settings.listen, settings.advertise)
        # Before anything is opened or heard: a release below the committed level refuses.
        self.committed_level = self.level_file.check_start()
        self.ticker = GroupTicker(
            AsyncioScheduler(asyncio.get_running_loop()), settings.tick_ms / 1000
        )
        self.ticker.every_tick.append(self.liveness.tick)
        host, port = parse_address(settings.listen)
        if settings.bookie:
            # Before listening: a bookie that cannot open its storage stops the start.
            self.bookie = BookieServer(
                self.node_id, Path(settings.data_dir) / "bookie", asyncio.get_running_loop()
            )
            self.dispatcher.bookie = self.bookie.handle
        self.port = await self.endpoint.listen(host, port, settings.advertise)
        self.address_book.learn(
            self.node_id, settings.advertise or format_address(host, self.port), AddressSource.SELF
        )
        voters = () if settings.join else tuple(sorted([*settings.peers, settings.node_id]))
        machine = KVStateMachine()
        self.streams = StreamService(self, lambda: self.groups[KV_GROUP], machine)
        group = self.add_group(
            KV_GROUP, TopicWatchingMachine(machine, self.streams.schedule_sync), voters
        )
        group.on_configuration = self.configuration_changed
        self.kv = KVService(
            group.host, machine, lambda: self.address_of(group.core.leader_id), KVLimits()
        )
        self.dispatcher.kv = self.kv
        self.start_auth(machine, group)
        self.dispatcher.streams = self.streams.handle
        self.start_sharded_kv()
        self.host_ha_controller(voters)
        self.host_group_coordinator(voters)
        self.liveness.set_peers(self.address_book.peer_addresses())
        self.ticker.start()
        for hosted in self.groups.values():
            hosted.start()
        self.streams.start()
        self.sharded_kv.start()
        if self.ha_controller is not None:
            self.ha_controller.start()
        if self.group_coordinator is not None:
            self.group_coordinator.start()
        self.start_registration()
        if settings.http_listen:
            await self.observability.serve_http(settings.http_listen, self)
        log.info(
            "node %s listening on %s:%d (data in %s)",
            self.node_id,
            host,
            self.port,
            settings.data_dir,
        )
        return self.port

    def start_auth(self, machine: KVStateMachine, group: GroupRunner) -> None:
        """Check every client request against the auth state of the "kv" group."""
        view = AuthStateView(lambda: machine.data, lambda: machine.auth_generation)
        loop = asyncio.get_running_loop()
        guard = AuthGuard(
            view,
            loop.time,
            self.settings.auth_token_ttl_ms / 1000,
            offload=self.hash_off_loop,
            is_authority=lambda: group.core.is_leader,
            call_later=loop.call_later,
        )
        if self.kv is not None:
            guard.service = AuthRequestService(
                self.kv,
                view,
                lambda: self.address_of(group.core.leader_id),
                offload=self.hash_off_loop,
            )
        machine.auth_changed = guard.refresh
        guard.refresh()  # the state may have come from a snapshot before this listened
        self.dispatcher.auth = guard
        self.auth_view = view

    def hash_off_loop(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """Password hashing (`auth.guard.Offload`) on its own thread: tens of milliseconds
        each, which on the loop would hold up heartbeats."""
        future = asyncio.get_running_loop().run_in_executor(self.auth_executor, work)
        future.add_done_callback(lambda finished: done(finished.result()))

    def node_credentials(self) -> Credentials | None:
        """What this node's own clients present to other nodes (see `auth.guard`). Called
        from client threads too: it decodes the switch from the data, touching no cache."""
        kv = self.kv
        if kv is None:
            return None
        try:
            secret = read_switch(kv.machine.data).node_secret
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # logged by the auth state's reader
        return Credentials(user=NODE_USER, password=secret) if secret else None

    def start_registration(self) -> None:
        """Heartbeat the bookie's registration through this node and its peers."""
        if self.bookie is None:
            return
        self.registrar = BookieRegistrar(
            self.bookie,
            lambda: self.addresses[self.node_id],
            self.metadata_endpoints,
            self.settings.cluster_id,
            RegistrationSettings(heartbeat_seconds=self.settings.bookie_heartbeat_ms / 1000),
            credentials=self.node_credentials,
            tls=self.settings.tls.dialing_tls(),
        )
        self.registrar.start()
        self.bookie_garbage = BookieGarbageCollector(
            self.bookie,
            self.metadata_endpoints,
            self.settings.cluster_id,
            GarbageSettings(interval_seconds=self.settings.bookie_garbage_interval_ms / 1000),
            credentials=self.node_credentials,
            tls=self.settings.tls.dialing_tls(),
            on_collected=self.observability.metrics.collected_by_bookie,
        )
        self.bookie_garbage.start()

    def metadata_endpoints(self) -> list[str]:
        """Client addresses of the "kv" group: this node first, then the peers it knows
        (leaving out placeholders such as port 0 that no client can dial)."""
        addresses = self.addresses
        own = addresses.pop(self.node_id)
        return [own, *(a for _, a in sorted(addresses.items()) if is_dialable(a))]

    def add_group(self, name: str, machine: StateMachine, voters: tuple[str, ...]) -> GroupRunner:
        """A Raft group hosted here (not started), its data in `data_dir/name`."""
        settings = self.settings
        group = GroupRunner(
            name,
            self.raft_config(),
            Path(settings.data_dir) / name,
            machine,
            self.send,
            Configuration(voters=voters),
            self.executor,
            GroupSettings(
                tick_seconds=settings.tick_ms / 1000,
                snapshot_entries=settings.snapshot_entries,
                snapshot_trailing_entries=settings.snapshot_trailing_entries,
                fsync=settings.fsync,
            ),
            self.ticker,
            hooks=self.observability.hooks_for(name),
            background=self.sync_background,
        )
        self.register_group(name, group)
        return group

    def register_group(self, name: str, group: GroupRunner) -> None:
        self.observability.attach(name, group)
        self.groups[name] = group
        group.host.use_node_liveness(self.liveness.is_reachable)
        group.on_storage_failure = self.group_down

    def group_down(self, group_id: str) -> None:
        """A group stopped here while this node goes on: tell its other members, so a quiet
        follower whose leader was here campaigns instead of trusting this node's pings."""
        group = self.groups.get(group_id)
        if group is None:
            return
        for member in sorted(group.core.configuration.members()):
            if member != self.node_id:
                self.endpoint.send_groups_down(member, self.node_id, [group_id])

    def start_sharded_kv(self) -> None:
        """Host the controller group and the shard groups this node is a member of."""
        settings = self.settings
        self.peers = AsyncioPeerRequests(
            self.requester, AsyncioScheduler(asyncio.get_running_loop())
        )
        self.sharded_kv = compose_sharded_kv(
            self.node_id,
            ShardedKVLayout(
                controller=list(settings.controller),
                shard_groups=dict(settings.shard_groups),
                shard_count=settings.shard_count,
                monitor_seconds=settings.shard_monitor_ms / 1000,
                pull_bytes_max=settings.shard_pull_bytes_max,
                preferred_leader_seconds=settings.preferred_leader_ms / 1000,
            ),
            lambda name, machine, voters: self.add_group(name, machine, voters).host,
            peers=self.peers,
            pacer=self.migration_pacer,
            controller_addresses=self.controller_addresses,
            leader_address=lambda host: lambda: self.address_of(host.leader_id),
        )
        self.dispatcher.controller = self.sharded_kv.controller
        self.dispatcher.shard_services = self.sharded_kv.shard_services

    def host_ha_controller(self, voters: tuple[str, ...]) -> None:
        """Host the HA controller group (not started) and serve it, unless turned off."""
        settings = self.settings
        if not settings.ha_controller:
            return
        machine = HAControllerMachine(settings.ha_broker_heartbeat_timeout_ms)
        group = self.add_group(wire.HA_CONTROLLER_GROUP, machine, voters)
        self.ha_controller = HAControllerService(
            group.host,
            machine,
            lambda: self.address_of(group.core.leader_id),
            settings.ha_controller_check_ms / 1000,
            self.liveness.is_reachable,
        )
        self.dispatcher.ha_controller = self.ha_controller

    def host_group_coordinator(self, voters: tuple[str, ...]) -> None:
        """Host the consumer-group coordinator group (not started) and serve it."""
        machine = GroupCoordinatorMachine()
        machine.on_level_raised = self.level_raised
        group = self.add_group(wire.GROUP_COORDINATOR_GROUP, machine, voters)
        # The previous release's offsets are read through the "kv" leader, wherever it is.
        self.previous_offsets = KVPreviousOffsets(
            group.host.scheduler,
            self.metadata_endpoints,
            self.settings.cluster_id,
            credentials=self.node_credentials,
            tls=self.settings.tls.dialing_tls(),
        )
        self.group_coordinator = GroupCoordinatorService(
            group.host,
            machine,
            lambda: self.address_of(group.core.leader_id),
            self.streams.partition_count,
            previous_offsets=self.previous_offsets,
            peer_levels=self.peer_levels,
        )
        self.dispatcher.group_coordinator = self.group_coordinator

    def level_raised(self, level: int) -> None:
        """A gated group applied a raise of the cluster's feature level: keep it, so that a
        release below it refuses to start here."""
        if level > self.committed_level:
            self.committed_level = level
            self.level_file.raise_to(level)

    @property
    def controller(self) -> ControllerService | None:
        return self.sharded_kv.controller

    @property
    def shard_services(self) -> dict[int, ShardGroupService]:
        return self.sharded_kv.shard_services

    @property
    def migrators(self) -> list[ShardMigrator]:
        return self.sharded_kv.migrators

    @property
    def preferred_leaders(self) -> PreferredLeaders:
        return self.sharded_kv.preferred_leaders

    def host_of(self, group: str) -> RaftHost | None:
        runner = self.groups.get(group)
        return runner.host if runner is not None else None

    def controller_addresses(self) -> list[str]:
        addresses = self.addresses
        return [addresses[member] for member in self.settings.controller if member in addresses]

    async def stop(self) -> None:
        await self.observability.close()
        # First, while this node's endpoint and bookie still serve: close the ledger topics
        # it owns and hand their leases on.
        await self.streams.release_ledger_topics()
        if self.registrar is not None:
            # First, while the "kv" group still runs here to take the last write.
            await self.registrar.stop()
        if self.bookie_garbage is not None:
            await self.bookie_garbage.stop()
        self.sharded_kv.stop()
        if self.ha_controller is not None:
            self.ha_controller.stop()
        if self.group_coordinator is not None:
            self.group_coordinator.stop()
        if self.previous_offsets is not None:
            self.previous_offsets.close()
        if self.peers is not None:
            await self.peers.close()
        await self.requester.close()
        await self.endpoint.close()
        if self.ticker is not None:
            self.ticker.stop()
        await self.streams.stop()
        for group in list(self.groups.values()):
            if not group.stopped:
                await group.stop()
        if self.bookie is not None:
            await self.bookie.close()
        self.executor.shutdown(wait=True)
        self.sync_background.shutdown()
        self.auth_executor.shutdown(wait=False, cancel_futures=True)

    @property
    def addresses(self) -> dict[str, str]:
        """Every node's address as this node knows it (a copy)."""
        return self.address_book.addresses()

    def address_of(self, node_id: str | None) -> str | None:
        return self.address_book.address_of(node_id) if node_id is not None else None

    def resolve(self, server: str) -> str:
        """A shard group's server as an address: a node id's current address, else the
        name itself (taken as "host:port")."""
        return self.address_book.address_of(server) or server

    def configuration_changed(self, configuration: Configuration) -> None:
        self.learn_addresses(dict(configuration.addresses))

    def learn_addresses(
        self, learned: dict[str, str], source: AddressSource = AddressSource.STORED
    ) -> None:
        """Take `learned` addresses from `source`; by default they come from the logs
        (configurations, topic descriptors), which only fill gaps (see `node/addresses`)."""
        if self.address_book.learn_all(learned, source):
            self.peers_changed()

    def on_peer_address(self, peer: str, address: str) -> None:
        if self.address_book.learn(peer, address, AddressSource.ANNOUNCED):
            log.info("node %s now listens at %s", peer, address)
            self.peers_changed()

    def peers_changed(self) -> None:
        peer_addresses = self.address_book.peer_addresses()
        self.endpoint.update_peers(peer_addresses)
        self.liveness.set_peers(peer_addresses)

    # --- transport handler --------------------------------------------------------------

    def send(self, group: str, target: str, message: Message) -> None:
        row = row_of(group, message)
        if row is None:
            self.endpoint.send(target, wire.RaftEnvelope(group=group, message=message))
        else:  # a plain heartbeat or answer: one row in the pair's batch (heartbeat_rows.py)
            self.endpoint.send_row(target, row)

    def on_peer_batch(self, batch: wire.PeerBatch) -> None:
        for group_id in batch.down_groups:
            group = self.groups.get(group_id)
            if group is not None and batch.down_node:
                group.host.peer_unreachable(batch.down_node)
        for envelope in batch.envelopes:
            group = self.groups.get(envelope.group)
            if group is None or envelope.message.target != self.node_id:
                self.unknown_group_messages += 1
                continue
            group.step(envelope.message)
        if batch.heartbeats or batch.heartbeat_answers:
            self.step_rows(batch)

    def step_rows(self, batch: wire.PeerBatch) -> None:
        """Step each row as the message it stands for (after the batch's envelopes: rows
        go out at once, envelopes after a Ready, and Raft takes either order)."""
        groups = self.groups
        source = batch.source
        node_id = self.node_id
        if not source or source == node_id:
            self.unknown_group_messages += len(batch.heartbeats) + len(batch.heartbeat_answers)
            return
        for heartbeat in batch.heartbeats:
            group = groups.get(heartbeat.group)
            if group is None:
                self.unknown_group_messages += 1
                continue
            group.step(push_of(heartbeat, source, node_id))
        for answer in batch.heartbeat_answers:
            group = groups.get(answer.group)
            if group is None:
                self.unknown_group_messages += 1
                continue
            group.step(answer_of(answer, source, node_id))

    def on_client_request(
        self, request: wire.ClientRequest, reply: Replier, peer_common_name: str = ""
    ) -> None:
        self.dispatcher.on_client_request(request, reply, peer_common_name)


def is_dialable(address: str) -> bool:
    try:
        parse_endpoint(address)
    except ValueError:
        return False
    return True


class NodeFailedError(QuorumLogError):
    """The node stopped itself: something that must never happen did (a violated
    invariant, a bug). Going on could persist or send wrong state, so it stops instead."""


def is_fatal(error: BaseException | None) -> bool:
    """Does this exception, reaching the event loop, mean the process must stop? Typed
    refusals and I/O trouble on one connection do not; anything else is a bug."""
    return error is not None and not isinstance(
        error, QuorumLogError | OSError | asyncio.CancelledError | asyncio.TimeoutError
    )


def stop_on_fatal_errors(name: str, stop: asyncio.Event) -> list[str]:
    """Make an unexpected exception reaching the running loop set `stop` (fail-stop);
    returns the list its reasons are appended to."""
    failures: list[str] = []

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if not is_fatal(error):
            loop.default_exception_handler(context)
            return
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        log.critical("%s stops: %s (%s)", name, reason, context.get("message"))
        failures.append(reason)
        stop.set()

    asyncio.get_running_loop().set_exception_handler(handle)
    return failures


async def run_node(
    settings: NodeSettings, stop: asyncio.Event, started: Callable[[Node], None] | None = None
) -> None:
    """Run a node until `stop` is set. Raises NodeFailedError, after stopping cleanly, if
    an unexpected exception reached the event loop (fail-stop)."""
    failures = stop_on_fatal_errors(f"node {settings.node_id}", stop)
    node = Node(settings)
    await node.start()
    if started is not None:
        started(node)
    try:
        await stop.wait()
    finally:
        await node.stop()
    if failures:
        raise NodeFailedError(failures[0])
