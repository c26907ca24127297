"""Serves the HA controller group (reference 003): broker registrations, heartbeats,
elections and SyncStateSet changes through its log, reads behind a ReadIndex round, and
the leader's periodic check that elects a new master for a group whose master went silent.

The controller is its own Raft group, "ha-controller", hosted on every node with the same
bootstrap members as the "kv" group. Not commands in the "kv" group, although the issue
allows sharing: every broker heartbeats every few hundred milliseconds, and those entries
would crowd the metadata log and its snapshots and couple the KV machine's format to this
one; a group of its own keeps the KV machine untouched, its snapshot small and versioned
on its own, and its leader (which runs the check) independent of the metadata leader.

Requests that arrive in one event-loop turn become one entry, as KV writes do. The check
runs on a timer of the group's scheduler (no asyncio), so the simulator runs it on virtual
time. A new leader waits one heartbeat timeout before its first check: while the old
leader was gone no heartbeat reached the log, so by the log's clock every broker looks
silent until the brokers' next heartbeats are applied under the new leader. The wait is
skipped for a master whose node this node's own peer liveness (runtime/liveness.py) already
reports unreachable: that broker cannot heartbeat to anyone, so waiting only delays its
failover (when the master's node also led the controller, the kill costs a controller
election and then one heartbeat timeout by the log's clock, not two). This only decides
when an election is proposed; whether it elects, and whom, is still decided in the log by
the machine with the entry's stamp, so a wrong liveness view costs availability at worst,
never safety. Each automatic
election names the MasterEpoch it saw, so two leaders that saw the same silent master
elect once (the second entry is refused as stale).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from quorumlog.codec import wire
from quorumlog.errors import QuorumLogError
from quorumlog.ha.controller_machine import HAControllerMachine
from quorumlog.ha.controller_model import (
    HA_CONTROLLER_QUERY_TYPES,
    ElectMaster,
    GetGroup,
    HAControllerBatch,
    HAControllerCommand,
    HAControllerEntry,
    HAControllerResult,
    Refusal,
    decode_commands,
    encode_entry,
    encode_results,
)
from quorumlog.node.batched_proposals import BatchedProposals
from quorumlog.node.command_requests import accepted_commands
from quorumlog.node.errors_to_wire import after_read_barrier, error_response
from quorumlog.runtime.completion import Completion
from quorumlog.runtime.handle import GroupHandle
from quorumlog.runtime.resources import Timer

log = logging.getLogger("quorumlog.node")

Replier = Callable[[wire.Frame], None]
COMMANDS_PER_REQUEST_MAX = 1_000
CHECK_INTERVAL_SECONDS_DEFAULT = 0.25
"""How often the controller leader looks for silent masters."""


class HAControllerService:
    def __init__(
        self,
        group: GroupHandle,
        machine: HAControllerMachine,
        leader_address: Callable[[], str | None],
        check_interval_seconds: float = CHECK_INTERVAL_SECONDS_DEFAULT,
        node_reachable: Callable[[str], bool] | None = None,
    ) -> None:
        if check_interval_seconds <= 0:
            raise ValueError(
                f"check_interval_seconds must be positive, got {check_interval_seconds}"
            )
        self.group = group
        self.machine = machine
        self.leader_address = leader_address
        self.check_interval_seconds = check_interval_seconds
        self.node_reachable = node_reachable
        """This node's view of whether another node answers (a broker's id is its node's);
        None: no view, every new leader waits its whole grace."""
        self.proposals: BatchedProposals[HAControllerBatch] = BatchedProposals(
            group, make_entry, answer, self.reject
        )
        self.timer: Timer | None = None
        self.leading_since_seconds: float | None = None
        """When this node was first seen leading, by the monotonic clock; None if not."""
        self.elections_in_flight: set[tuple[str, int]] = set()
        """(group, MasterEpoch) of automatic elections proposed and not yet applied."""
        self.elections_proposed = 0
        self.check_client_id = f"ha-controller-check/{group.node_id}"

    # --- client requests -------------------------------------------------------------------

    def reject(self, reply: Replier, request_id: int, error: BaseException) -> None:
        reply(error_response(request_id, error, self.leader_address))

    def handle(self, request: wire.HAControllerRequest, reply: Replier) -> None:
        commands = accepted_commands(
            request.request_id,
            request.commands,
            decode_commands,
            COMMANDS_PER_REQUEST_MAX,
            self.group,
            self.leader_address,
            reply,
            "commands",
        )
        if commands is None:
            return
        if all(isinstance(command, HA_CONTROLLER_QUERY_TYPES) for command in commands):
            self.query(request, commands, reply)
            return
        batch = HAControllerBatch(request.client_id, request.first_unacknowledged, commands)
        self.proposals.add(request.request_id, batch, reply)

    def query(
        self,
        request: wire.HAControllerRequest,
        commands: list[HAControllerCommand],
        reply: Replier,
    ) -> None:
        def answer() -> None:
            results = [self.read(command) for command in commands]
            reply(
                wire.HAControllerResponse(
                    request_id=request.request_id, results=encode_results(results)
                )
            )

        after_read_barrier(
            self.group.linearizable_read, request.request_id, reply, self.leader_address, answer
        )

    def read(self, command: HAControllerCommand) -> HAControllerResult:
        """A query answered from the applied state, liveness by this leader's clock (the
        clock that stamps the entries), so a group whose brokers all went silent shows it
        even when nothing is being logged."""
        now_ms = max(self.machine.clock_ms, self.group.scheduler.wall_time_ms())
        if isinstance(command, GetGroup):
            info = self.machine.group_info(command.group, now_ms)
            if info is None:
                return HAControllerResult(
                    ok=False,
                    refusal=Refusal.UNKNOWN_GROUP,
                    error=f"no broker group {command.group!r}",
                )
            return HAControllerResult(ok=True, group=info)
        return HAControllerResult(ok=True, groups=self.machine.list_groups(now_ms))

    # --- the leader's check for silent masters -------------------------------------------

    def start(self) -> None:
        if self.timer is None:
            self.timer = self.group.scheduler.call_later(self.check_interval_seconds, self.tick)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def tick(self) -> None:
        self.timer = self.group.scheduler.call_later(self.check_interval_seconds, self.tick)
        self.check()

    def check(self) -> None:
        """While leading (and past the grace of one heartbeat timeout), propose an
        automatic election for every group whose master is silent, once per epoch."""
        scheduler = self.group.scheduler
        if not self.group.is_leader:
            self.leading_since_seconds = None
            return
        now_seconds = scheduler.monotonic_seconds()
        if self.leading_since_seconds is None:
            self.leading_since_seconds = now_seconds
        grace_seconds = self.machine.broker_heartbeat_timeout_ms / 1000
        in_grace = now_seconds - self.leading_since_seconds < grace_seconds
        if in_grace and self.node_reachable is None:
            return
        now_ms = scheduler.wall_time_ms()
        for name, master_epoch in self.machine.groups_needing_election(now_ms):
            if in_grace and not (
                self.master_node_unreachable(name)
                and self.machine.has_election_candidates(name, now_ms)
            ):
                # In the grace, only a master known to be gone, and only once a member of
                # its SyncStateSet has heartbeated to this leader: an election now that
                # found nobody would leave the group masterless for nothing.
                continue
            if (name, master_epoch) not in self.elections_in_flight:
                self.propose_election(name, master_epoch)

    def master_node_unreachable(self, name: str) -> bool:
        """Whether group `name` has a master whose node this node sees as unreachable."""
        master_id = self.machine.master_of(name)
        if master_id is None or self.node_reachable is None:
            return False
        if master_id == self.group.node_id:
            return False
        return not self.node_reachable(master_id)

    def propose_election(self, name: str, master_epoch: int) -> None:
        command = ElectMaster(name, automatic=True, expected_master_epoch=master_epoch)
        batch = HAControllerBatch(self.check_client_id, 0, [command])
        try:
            future = self.group.propose(make_entry(self.group.scheduler.wall_time_ms(), [batch]))
        except QuorumLogError as error:
            log.info("HA controller: election for %s not proposed: %s", name, error)
            return
        key = (name, master_epoch)
        self.elections_in_flight.add(key)
        self.elections_proposed += 1

        def done(completion: Completion[Any]) -> None:
            self.elections_in_flight.discard(key)
            if completion.exception() is not None:
                return
            [[result]] = completion.result()
            if result.ok and result.group is not None:
                log.info(
                    "HA controller: %s has master %s at MasterEpoch %d (was silent at %d)",
                    name,
                    result.group.master_id,
                    result.group.master_epoch,
                    master_epoch,
                )

        future.add_done_callback(done)


def make_entry(timestamp_ms: int, batches: list[HAControllerBatch]) -> bytes:
    return encode_entry(HAControllerEntry(timestamp_ms=timestamp_ms, batches=batches))


def answer(reply: Replier, request_id: int, results: list[HAControllerResult]) -> None:
    reply(wire.HAControllerResponse(request_id=request_id, results=encode_results(results)))


__all__ = ["CHECK_INTERVAL_SECONDS_DEFAULT", "HAControllerService"]
