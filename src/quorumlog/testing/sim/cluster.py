"""A simulated Raft cluster with a scriptable API, for scenario tests and the seed runner.

    cluster = SimCluster(seed=7, options=SimOptions(node_count=5))
    leader = cluster.wait_for_leader()
    cluster.isolate(leader)
    cluster.run(ticks=40)
    cluster.heal()
    cluster.put("k", "v")
    assert cluster.get("k") == "v"

Everything runs on one event queue in virtual milliseconds; invariants are checked after
every event. Node ids are "n1".."nN". Time is given in ticks of `node.tick_ms`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration, MembershipChange
from quorumlog.raft.messages import Message
from quorumlog.testing.history import History
from quorumlog.testing.linearizability import LinearizabilityResult, check_linearizable
from quorumlog.testing.sim.checks import InvariantViolation, SimulationError, require
from quorumlog.testing.sim.events import EventQueue, derive_random
from quorumlog.testing.sim.invariants import InvariantChecker
from quorumlog.testing.sim.kv_machine import KvCommand, encode_command
from quorumlog.testing.sim.network import NetworkFaults, SimNetwork
from quorumlog.testing.sim.node import ClientReply, NodeOptions, SimNode
from quorumlog.testing.sim.trace import TraceRecorder
from quorumlog.testing.sim.workload import SimClient, Workload, WorkloadOptions

SCRIPT_CLIENT_ID = 1_000_000
"""The client id of the scripted helpers (`put`, `get`, ...), apart from workload clients."""
NOTE_CLIENT_ID = 1_000_001
"""The client id of `propose` markers."""


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
        self, seed: int, options: SimOptions | None = None, trace: TraceRecorder | None = None
    ) -> None:
        self.seed = seed
        self.options = options if options is not None else SimOptions()
        self.trace = trace
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
                checker=self.checker,
                trace=trace,
            )
            self.nodes[node_id] = node
            self.receivers[node_id] = node.receive
            self.checker.register(node)
        self.history = History()
        self.workload = Workload(
            events=self.events,
            nodes=self.nodes,
            options=self.options.workload,
            rng=derive_random(seed, "workload"),
            history=self.history,
        )
        self.note_sequence = 0
        self.script_client = SimClient(
            SCRIPT_CLIENT_ID,
            events=self.events,
            nodes=self.nodes,
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
        """Run one client operation to its end and return its output (recorded in history)."""
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

    def propose(self, note: str, node_id: str | None = None) -> tuple[int, int] | ClientReply:
        """Propose a marker entry (a KV "note", which changes no key) at `node_id` (default:
        the leader), outside any client's history: (index, term) or the refusal."""
        target = node_id if node_id is not None else self.leader()
        if target is None:
            return ClientReply("redirect", reason="no leader")
        self.note_sequence += 1
        command = KvCommand(NOTE_CLIENT_ID, self.note_sequence, "note", "", note)
        return self.nodes[target].propose_raw(encode_command(command))

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
        return check_linearizable(self.history.operations(), time_budget_steps=time_budget_steps)

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
