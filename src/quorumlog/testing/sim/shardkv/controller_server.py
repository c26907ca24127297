"""The controller group's request handling: configuration queries and admin commands.

Queries are served by ReadIndex from the applied history (never stored in sessions, as
the machine's docstring explains); join, leave and move go through the log in a
`ControllerEntry` stamped with the leader's virtual clock, so a retried command with the
same (client id, sequence) is applied once.
"""

from __future__ import annotations

from quorumlog.shard.controller import ControllerMachine
from quorumlog.shard.controller_commands import ControllerBatch, ControllerEntry, encode_entry
from quorumlog.testing.sim.events import EventQueue
from quorumlog.testing.sim.shardkv.member import ProposalOutcome, RaftMember
from quorumlog.testing.sim.shardkv.rpc import (
    ControllerAdmin,
    ControllerAdminReply,
    ControllerQuery,
    ControllerQueryReply,
    NotLeader,
    Reply,
    RpcMessage,
)


class ControllerServer:
    def __init__(self, member: RaftMember[ControllerMachine], events: EventQueue) -> None:
        self.member = member
        self.events = events

    def handle(self, request: RpcMessage, reply: Reply) -> None:
        member = self.member
        if not member.up:
            return
        if isinstance(request, ControllerQuery):
            self.query(request, reply)
        elif isinstance(request, ControllerAdmin):
            self.admin(request, reply)

    def query(self, request: ControllerQuery, reply: Reply) -> None:
        member = self.member

        def confirmed(ok: bool) -> None:
            if not ok or not member.up:
                reply(NotLeader())
                return
            reply(ControllerQueryReply(member.machine.query(max(request.number, -1))))

        if not member.read_index(confirmed):
            reply(NotLeader())

    def admin(self, request: ControllerAdmin, reply: Reply) -> None:
        batch = ControllerBatch(request.client_id, request.first_unacknowledged, [request.command])
        data = encode_entry(ControllerEntry(self.events.now_ms, [batch]))

        def done(outcome: ProposalOutcome) -> None:
            results = outcome.result
            if not outcome.applied or not isinstance(results, list) or not results:
                reply(NotLeader())
                return
            reply(ControllerAdminReply(results[0][0]))

        if not self.member.propose(data, done):
            reply(NotLeader())
