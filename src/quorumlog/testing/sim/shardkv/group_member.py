"""A shard group's server: client requests, the previous owner's side of migrations, and
the leader's periodic run of `shard.group_driver.monitor`.

The driver is pure; this is the runtime that carries out its actions on virtual time:

* `FetchConfiguration` — a `ControllerQuery` to the controller group (served by ReadIndex);
  the answer is handed to the next `monitor` call;
* `Propose` — proposed once while it is pending (the monitor runs every
  `monitor_interval_ms` and would otherwise fill the log with copies);
* `SendPullRequest` — one chunk at a time per previous owner: the next chunk is asked for
  only once the insert of the last one is applied (`next_pull_request`). Each attempt goes
  to a seeded choice among the owner's replicas: any replica that applied the configuration
  answers, as on real nodes, so the new owner may hold data from a follower well before
  that group's leader has applied the configuration (members may lag, see `member.py`);
* `SendDeleteRequest` — to the previous owner's leader, following the "not leader" hints;
  its answer becomes the GC entry.

Everything kept between monitor runs is volatile and rebuilt from the applied state: it is
dropped when the member restarts or its term changes, which is what a real new leader
would do, so repeated pulls, inserts and deletes are exercised.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from quorumlog.kv.commands import ClientBatch
from quorumlog.shard.config import ShardConfiguration
from quorumlog.shard.group_commands import (
    ClientWrites,
    ControlApplied,
    DeleteRequest,
    DeleteResponse,
    GroupEntry,
    PullRequest,
    PullResponse,
    WritesApplied,
    WrongGroup,
    encode_entry,
)
from quorumlog.shard.group_driver import (
    Action,
    FetchConfiguration,
    Propose,
    SendDeleteRequest,
    SendPullRequest,
    delete_response_after_apply,
    entry_for_delete_response,
    entry_for_pull_response,
    handle_delete_request,
    handle_pull_request,
    monitor,
    next_pull_request,
)
from quorumlog.shard.group_machine import ShardGroupMachine
from quorumlog.testing.sim.events import EventQueue
from quorumlog.testing.sim.shardkv.exchange import Exchange
from quorumlog.testing.sim.shardkv.member import ProposalCallback, ProposalOutcome, RaftMember
from quorumlog.testing.sim.shardkv.rpc import (
    ControllerQuery,
    ControllerQueryReply,
    NotLeader,
    Reply,
    RpcMessage,
    RpcNetwork,
    ShardRead,
    ShardReadReply,
    ShardWrite,
    ShardWriteReply,
)
from quorumlog.testing.sim.trace import TraceRecorder


class ServerOptions(msgspec.Struct, frozen=True):
    monitor_interval_ms: int = 100
    request_timeout_ms: int = 300
    pull_bytes_max: int = 0
    """0: pull whole shards at once; otherwise chunked pulls of about this many bytes."""
    stuck_ms: int = 3_000
    """An exchange busy this long (its proposal was lost without a word) is retried."""


class ShardGroupServer:
    def __init__(
        self,
        gid: int,
        member: RaftMember[ShardGroupMachine],
        *,
        rpc: RpcNetwork,
        events: EventQueue,
        controller_servers: list[str],
        options: ServerOptions,
        rng: random.Random,
        trace: TraceRecorder | None,
    ) -> None:
        self.gid = gid
        self.member = member
        self.rpc = rpc
        self.events = events
        self.controller_servers = controller_servers
        self.options = options
        self.rng = rng
        """Which replica of another group a pull goes to."""
        self.trace = trace
        self.driver_key: tuple[int, int] = (-1, -1)
        self.fetched_configuration: ShardConfiguration | None = None
        self.fetch = Exchange()
        self.pulls: dict[tuple[int, int], Exchange] = {}
        self.deletes: dict[tuple[int, int], Exchange] = {}
        self.pending_entries: set[bytes] = set()
        self.monitor_runs = 0
        self.chunks_applied = 0
        self.lagging_leaderships = 0
        """Leaderships whose first monitor run found applied behind commit (apply lag)."""
        self.deletes_ahead_of_apply = 0
        """Deletes that reached this leader for a configuration it had not applied yet."""
        events.schedule(options.monitor_interval_ms, self.monitor_tick)

    # --- requests from clients and other groups -------------------------------------------

    def handle(self, request: RpcMessage, reply: Reply) -> None:
        if not self.member.up:
            return
        if isinstance(request, PullRequest):
            # Any replica that applied the configuration answers the same (frozen data).
            reply(handle_pull_request(self.member.machine, request))
        elif isinstance(request, ShardWrite):
            self.write(request, reply)
        elif isinstance(request, ShardRead):
            self.read(request, reply)
        elif isinstance(request, DeleteRequest):
            self.delete(request, reply)

    def write(self, request: ShardWrite, reply: Reply) -> None:
        batch = ClientBatch(request.client_id, request.first_unacknowledged, [request.command])
        entry = ClientWrites(self.events.now_ms, [batch])

        def done(outcome: ProposalOutcome) -> None:
            applied = outcome.result
            if not outcome.applied or not isinstance(applied, WritesApplied):
                reply(NotLeader())
                return
            result = applied.results[0][0]
            reply(ShardWriteReply(None if isinstance(result, WrongGroup) else result))

        if not self.member.propose(encode_entry(entry), done):
            reply(NotLeader())

    def read(self, request: ShardRead, reply: Reply) -> None:
        member = self.member

        def confirmed(ok: bool) -> None:
            if not ok or not member.up:
                reply(NotLeader())
                return
            value = member.machine.get(request.key)
            if isinstance(value, WrongGroup):
                reply(ShardReadReply(None, wrong_group=True))
            else:
                reply(ShardReadReply(value))

        if not member.read_index(confirmed):
            reply(NotLeader())

    def delete(self, request: DeleteRequest, reply: Reply) -> None:
        member = self.member
        if not member.is_leader:
            reply(NotLeader(leader_hint=member.core.leader_id))
            return
        # A leader answers from its applied state, which may lag its log (a new leader
        # still applying): the driver must not take "not applied yet" for "done".
        if request.configuration_number > member.machine.current_configuration.number:
            self.deletes_ahead_of_apply += 1
        answer = handle_delete_request(member.machine, request)
        if isinstance(answer, DeleteResponse):
            reply(answer)
            return

        def done(outcome: ProposalOutcome) -> None:
            result = outcome.result
            if outcome.applied and isinstance(result, ControlApplied) and member.up:
                reply(delete_response_after_apply(member.machine, request, result))
            else:
                reply(NotLeader())

        if not self.propose(answer.entry, done):
            reply(NotLeader())

    # --- the leader's monitor -------------------------------------------------------------

    def monitor_tick(self, _: object = None) -> None:
        self.events.schedule(self.options.monitor_interval_ms, self.monitor_tick)
        member = self.member
        if not member.is_leader or member.paused:
            # A paused process runs no timers; the next tick after its resume catches up
            # (the monitor works from the applied state, so a missed run loses nothing).
            return
        key = (member.incarnation, member.core.term)
        if key != self.driver_key:
            self.reset(key)
        self.monitor_runs += 1
        for action in monitor(member.machine, self.fetched_configuration):
            self.carry_out(action)

    def reset(self, key: tuple[int, int]) -> None:
        """A new leadership: forget every volatile exchange (a real new leader has none)."""
        self.driver_key = key
        if self.member.applied_index < self.member.core.commit_index:
            self.lagging_leaderships += 1
        self.fetch = Exchange()
        self.pulls = {}
        self.deletes = {}
        self.pending_entries = set()

    def carry_out(self, action: Action) -> None:
        if isinstance(action, Propose):
            self.propose(action.entry, None)
        elif isinstance(action, FetchConfiguration):
            self.fetch_configuration(action)
        elif isinstance(action, SendPullRequest):
            self.pull(action)
        elif isinstance(action, SendDeleteRequest):
            self.send_delete(action)

    def propose(self, entry: GroupEntry, callback: ProposalCallback | None) -> bool:
        """Propose unless the same entry is already pending here; False if not proposed."""
        data = encode_entry(entry)
        pending = self.pending_entries
        if data in pending:
            return False

        def done(outcome: ProposalOutcome) -> None:
            pending.discard(data)
            if callback is not None:
                callback(outcome)

        if not self.member.propose(data, done):
            return False
        pending.add(data)
        return True

    def ready(self, exchange: Exchange) -> bool:
        """Whether `exchange` may send now (a stuck one is released first)."""
        if exchange.stuck(self.events.now_ms, self.options.stuck_ms):
            exchange.release(rotate=True)
        return not exchange.busy

    def fetch_configuration(self, action: FetchConfiguration) -> None:
        exchange = self.fetch
        if not self.ready(exchange):
            return

        def handle(message: RpcMessage) -> None:
            if isinstance(message, ControllerQueryReply):
                self.fetched_configuration = message.configuration
                exchange.release()
            else:
                exchange.release(rotate=True)

        self.send(exchange, self.controller_servers, ControllerQuery(action.number), handle)

    def pull(self, action: SendPullRequest) -> None:
        key = (action.request.configuration_number, action.target_gid)
        exchange = self.pulls.setdefault(key, Exchange())
        if not self.ready(exchange):
            return
        if exchange.resume_at is not None:
            # Going on with this member's own pull: the previous owner's resume point.
            request = msgspec.structs.replace(
                action.request,
                resume_at=exchange.resume_at,
                resume_last_key=None,
                bytes_max=self.options.pull_bytes_max,
            )
        else:
            # A fresh pull, or one an earlier leader began (the driver resumes it).
            request = msgspec.structs.replace(action.request, bytes_max=self.options.pull_bytes_max)

        def handle(message: RpcMessage) -> None:
            if not isinstance(message, PullResponse):
                exchange.release(rotate=True)
                return
            entry = entry_for_pull_response(self.member.machine, message)
            if entry is None:
                exchange.release()
                return

            def applied(outcome: ProposalOutcome) -> None:
                if outcome.applied:
                    self.chunks_applied += 1
                    following = next_pull_request(request, message)
                    exchange.resume_at = following.resume_at if following is not None else None
                exchange.release()

            if not self.propose(entry, applied):
                exchange.release()

        self.send(exchange, [self.rng.choice(action.servers)], request, handle)

    def send_delete(self, action: SendDeleteRequest) -> None:
        key = (action.request.configuration_number, action.target_gid)
        exchange = self.deletes.setdefault(key, Exchange())
        if not self.ready(exchange):
            return

        def handle(message: RpcMessage) -> None:
            if isinstance(message, NotLeader):
                exchange.release_to(action.servers, message.leader_hint)
                return
            if not isinstance(message, DeleteResponse):
                exchange.release(rotate=True)
                return
            entry = entry_for_delete_response(self.member.machine, message)
            if entry is None:
                exchange.release()
                return
            if not self.propose(entry, lambda _: exchange.release()):
                exchange.release()

        self.send(exchange, action.servers, action.request, handle)

    def send(
        self,
        exchange: Exchange,
        servers: list[str],
        request: RpcMessage,
        handle: Callable[[RpcMessage], None],
    ) -> None:
        exchange.send(
            rpc=self.rpc,
            events=self.events,
            source=self.member.node_id,
            servers=servers,
            request=request,
            timeout_ms=self.options.request_timeout_ms,
            handle=handle,
            gate=self.member.hold,
        )
