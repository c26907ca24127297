"""A simulated Raft cluster with a scriptable API, for scenario tests and the seed runner.

    cluster = SimCluster(seed=7, options=SimOptions(node_count=5))
    leader = cluster.wait_for_leader()
    cluster.isolate(leader)
    cluster.run(ticks=40)
    cluster.heal()
    cluster.put("k", "v")
    assert cluster.get("k") == "v"

Every node runs the application's state machine (by default the shipped KV machine and
`KVService`: see application.py); `put`, `append` and `get` go through a client running
the shipped client logic, over the same frame network as the workload's clients. With
another application, drive the machine with `propose` and compare states with
`check_converged`.

Everything runs on one event queue in virtual milliseconds; invariants are checked after
every event. Node ids are "n1".."nN". Time is given in ticks of `node.tick_ms`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from quorumlog.errors import NotLeaderError
from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration, MembershipChange
from quorumlog.raft.messages import Message
from quorumlog.storage.entry import EntryType, LogEntry
from quorumlog.testing.history import History, Operation, OperationStatus
from quorumlog.testing.linearizability import (
    KV_MODEL,
    LinearizabilityResult,
    check_linearizable,
)
from quorumlog.testing.sim.application import KV_APPLICATION, SimApplication
from quorumlog.testing.sim.checks import InvariantViolation, SimulationError, require
from quorumlog.testing.sim.events import EventQueue, derive_random
from quorumlog.testing.sim.frame_network import SimFrameNetwork
from quorumlog.testing.sim.invariants import InvariantChecker
from quorumlog.testing.sim.network import NetworkFaults, SimNetwork
from quorumlog.testing.sim.node import NodeOptions, SimNode, client_address
from quorumlog.testing.sim.trace import TraceRecorder
from quorumlog.testing.sim.workload import SimClient, Workload, WorkloadOptions
from quorumlog.testing.txn_model import TXN_MODEL

SCRIPT_CLIENT = "script"
"""The client of the scripted helpers (`put`, `get`, ...), apart from workload clients."""


class SimOptions(msgspec.Struct, frozen=True):
    node_count: int = 3
    raft: RaftConfig = RaftConfig(node_id="template")
    """Raft settings for every node (node_id is replaced per node)."""
    node: NodeOptions = NodeOptions()
    network: NetworkFaults = NetworkFaults()
    workload: WorkloadOptions = WorkloadOptions()


class OperationTimeoutError(SimulationError):
    """A scripted operation did not finish within its deadline."""


class SimCluster:
    def __init__(
        self,
        seed: int,
        options: SimOptions | None = None,
        trace: TraceRecorder | None = None,
        application: SimApplication[Any] | None = None,
    ) -> None:
        self.seed = seed
        self.options = options if options is not None else SimOptions()
        self.trace = trace
        self.application = application if application is not None else KV_APPLICATION
        self.events = EventQueue()
        self.checker = InvariantChecker()
        self.receivers: dict[str, Callable[[Message], None]] = {}
        self.network = SimNetwork(
            self.events,
            derive_random(seed, "network"),
            self.options.network,
            self.receivers,
            trace,
        )
        self.frames = SimFrameNetwork(
            self.events,
            derive_random(seed, "frames"),
            self.options.network,
            self.network.blocked,
            trace,
        )
        node_ids = [f"n{number}" for number in range(1, self.options.node_count + 1)]
        self.bootstrap = Configuration(voters=tuple(node_ids))
        self.nodes: dict[str, SimNode] = {}
        for node_id in node_ids:
            raft_config = msgspec.structs.replace(self.options.raft, node_id=node_id)
            node = SimNode(
                node_id,
                seed=seed,
                raft_config=raft_config,
                bootstrap=self.bootstrap,
                options=self.options.node,
                events=self.events,
                network=self.network,
                frames=self.frames,
                application=self.application,
                checker=self.checker,
                trace=trace,
            )
            self.nodes[node_id] = node
            node.apply_observer = self.note_applied
            self.receivers[node_id] = node.receive
            self.checker.register(node)
        self.applied_indexes: set[int] = set()
        self.applied_commands: set[tuple[str, int]] = set()
        """Every (client id, sequence) some node's state machine was given (see
        `SimApplication.command_identities`)."""
        self.endpoints = {client_address(node_id): node_id for node_id in node_ids}
        """Each node's client address → its node id."""
        self.history = History()
        self.workload = Workload(
            events=self.events,
            frames=self.frames,
            endpoints=self.endpoints,
            options=self.options.workload,
            rng=derive_random(seed, "workload"),
            history=self.history,
        )
        self.script_client = SimClient(
            SCRIPT_CLIENT,
            events=self.events,
            frames=self.frames,
            endpoints=self.endpoints,
            history=self.history,
            options=self.options.workload,
            rng=derive_random(seed, "script-client"),
            stats=self.workload.stats,
        )

    # --- time ---------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        return self.events.now_ms

    @property
    def tick_ms(self) -> int:
        return self.options.node.tick_ms

    def run(self, ticks: int | None = None, *, ms: int | None = None) -> None:
        """Run every event due within the next `ticks` ticks (or `ms` milliseconds)."""
        duration_ms = ms if ms is not None else (ticks or 0) * self.tick_ms
        self.run_until_time(self.events.now_ms + duration_ms)

    def run_until_time(self, deadline_ms: int) -> None:
        try:
            self.events.run_until(deadline_ms)
        except Exception as error:
            self._annotate(error)
            raise

    def run_until(self, predicate: Callable[[], bool], ticks_max: int) -> bool:
        """Run event by event until `predicate()` holds; False if `ticks_max` pass first."""
        events = self.events
        deadline_ms = events.now_ms + ticks_max * self.tick_ms
        try:
            while not predicate():
                next_time_ms = events.next_time_ms()
                if next_time_ms is None or next_time_ms > deadline_ms:
                    events.now_ms = max(events.now_ms, deadline_ms)
                    return predicate()
                events.run_next()
        except Exception as error:
            self._annotate(error)
            raise
        return True

    def _annotate(self, error: Exception) -> None:
        """Say which seed and moment a failure comes from, once, on its way out."""
        note = f"simulated cluster: seed {self.seed}, {self.options.node_count} nodes"
        if note not in getattr(error, "__notes__", ()):
            error.add_note(note)
            error.add_note(f"at {self.now_ms} ms:\n{self.describe()}")

    # --- faults -------------------------------------------------------------------------

    def partition(self, groups: list[list[str]]) -> None:
        """Cut every link between the groups (nodes in no group keep all their links)."""
        self._trace(f"partition {groups}")
        self.network.partition(groups)

    def isolate(self, node_id: str) -> None:
        self.partition([[node_id], [other for other in self.nodes if other != node_id]])

    def cut(self, source: str, target: str) -> None:
        """Drop messages from `source` to `target` only."""
        self._trace(f"cut {source} -> {target}")
        self.network.cut(source, target)

    def heal(self) -> None:
        self._trace("heal")
        self.network.heal()

    def set_network_faults(self, faults: NetworkFaults) -> None:
        """The faults of both networks from now on: Raft messages and client frames."""
        self.network.set_faults(faults)
        self.frames.set_faults(faults)

    def crash(self, node_id: str) -> None:
        self.nodes[node_id].crash()

    def restart(self, node_id: str) -> None:
        self.nodes[node_id].restart()

    def pause(self, node_id: str) -> None:
        self._trace(f"pause {node_id}")
        self.nodes[node_id].pause()

    def resume(self, node_id: str) -> None:
        self._trace(f"resume {node_id}")
        self.nodes[node_id].resume()

    def _trace(self, text: str) -> None:
        if self.trace is not None:
            self.trace.record(self.events.now_ms, text)

    # --- views --------------------------------------------------------------------------

    def leader(self) -> str | None:
        """The available leader of the highest term, if any."""
        best: SimNode | None = None
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            if (
                node.available
                and node.is_leader
                and (best is None or node.core.term > best.core.term)
            ):
                best = node
        return best.node_id if best is not None else None

    def wait_for_leader(self, ticks_max: int = 200) -> str:
        if not self.run_until(lambda: self.leader() is not None, ticks_max):
            raise OperationTimeoutError(f"no leader within {ticks_max} ticks:\n{self.describe()}")
        leader = self.leader()
        require(leader is not None, "a leader was just seen")
        return str(leader)

    def node(self, node_id: str) -> SimNode:
        return self.nodes[node_id]

    def describe(self) -> str:
        return "\n".join(self.nodes[node_id].describe() for node_id in sorted(self.nodes))

    @property
    def invariant_checks(self) -> int:
        return self.checker.checks

    # --- scripted requests ----------------------------------------------------------------

    def request(self, kind: str, key: str, argument: Any = None, ticks_max: int = 400) -> Any:
        """Run one client operation to its end and return its output (recorded in history).
        Needs the KV application (or another whose service answers KV frames)."""
        require(self.application.service_factory is not None, "no service answers clients")
        outcome: list[tuple[str, Any]] = []
        self.script_client.begin(kind, key, argument, lambda *result: outcome.append(result))
        if not self.run_until(lambda: bool(outcome), ticks_max):
            self.script_client.abandon()  # so the next scripted request can start
            raise OperationTimeoutError(
                f"{kind} {key!r} did not finish within {ticks_max} ticks:\n{self.describe()}"
            )
        status, output = outcome[0]
        if status != "ok":
            raise OperationTimeoutError(f"{kind} {key!r} ended {status}")
        return output

    def put(self, key: str, value: str, ticks_max: int = 400) -> None:
        self.request("put", key, value, ticks_max)

    def append(self, key: str, suffix: str, ticks_max: int = 400) -> None:
        self.request("append", key, suffix, ticks_max)

    def get(self, key: str, ticks_max: int = 400) -> str | None:
        value = self.request("get", key, None, ticks_max)
        return value if value is None else str(value)

    def propose(self, entry: bytes | None = None, node_id: str | None = None) -> tuple[int, int]:
        """Propose one entry at `node_id` (default: the leader), outside any client's
        history; `entry` None: the application's marker entry, which changes nothing.
        Returns (index, term); raises the group's typed refusal (NotLeaderError naming the
        leader, PendingFullError, ...), or NotLeaderError if there is no leader to ask."""
        if entry is None:
            entry = self.application.marker_entry
            if entry is None:
                raise SimulationError("the application has no marker entry: pass one")
        target = node_id if node_id is not None else self.leader()
        if target is None:
            raise NotLeaderError("any node", None)
        return self.nodes[target].propose(entry)

    def change_membership(self, change: MembershipChange, node_id: str | None = None) -> int | None:
        """Propose a membership change at `node_id` (default: the leader); None if it
        cannot take one now (not leader, not ready, a change in progress, ...)."""
        target = node_id if node_id is not None else self.leader()
        if target is None:
            return None
        self._trace(f"change membership {change!r} at {target}")
        return self.nodes[target].change_membership(change)

    def transfer_leadership(self, target: str) -> bool:
        leader = self.leader()
        if leader is None or leader == target:
            return False
        self._trace(f"transfer leadership {leader} -> {target}")
        return self.nodes[leader].transfer_leadership(target)

    # --- end-of-run checks -------------------------------------------------------------

    def check_linearizable(self, time_budget_steps: int = 1_000_000) -> LinearizabilityResult:
        model = TXN_MODEL if self.options.workload.v3 else KV_MODEL
        return check_linearizable(
            self.resolved_operations(), model, time_budget_steps=time_budget_steps
        )

    def note_applied(self, entry: LogEntry) -> None:
        identities = self.application.command_identities
        if identities is None or entry.type is not EntryType.DATA:
            return
        if entry.index in self.applied_indexes:
            return  # one entry per index (the checker holds every node to that)
        self.applied_indexes.add(entry.index)
        self.applied_commands.update(identities(entry.data))

    def resolved_operations(self) -> list[Operation]:
        """The history, with every write of unknown outcome that no state machine was ever
        given marked failed: it never happened, and never can, once the clients stopped.
        (The simulator sees what no real client can; the rest stay unknown.) Fewer unknown
        operations make the linearizability search far cheaper, and lose no anomaly."""
        identities = self.workload.stats.write_identities
        operations = self.history.operations()
        if self.application.command_identities is None:
            return operations
        resolved = []
        for operation in operations:
            identity = identities.get(operation.operation_id)
            if (
                operation.status is OperationStatus.UNKNOWN
                and identity is not None
                and identity not in self.applied_commands
            ):
                operation = msgspec.structs.replace(
                    operation, status=OperationStatus.FAILED, return_time=operation.call_time
                )
            resolved.append(operation)
        return resolved

    def check_converged(self) -> None:
        """Nodes that applied the same index hold the same state machine."""
        by_index: dict[int, tuple[str, bytes]] = {}
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            if not node.up:
                continue
            state = node.machine.snapshot()
            seen = by_index.setdefault(node.applied_index, (node_id, state))
            if seen[1] != state:
                raise InvariantViolation(
                    f"{node_id} and {seen[0]} applied through {node.applied_index} but hold "
                    "different states"
                )
