"""One seed's consumer-group world: a coordinator cluster and the consumers of its groups.

- the coordinator: `SimCluster` nodes n1..n3 running the shipped machine and service
  (coordinator.py), under the Raft simulator's nemesis (crashes, pauses, partitions
  between nodes, leader transfers, crashes mid-write) and a faulty frame network (delays,
  drops, duplicates);
- the consumers (client.py) of one or two groups over topics with fixed partition counts;
  a consumer nemesis makes them leave, or crash (no leave: the group expires them), and
  join again as new members, or go silent (paused) for less or more than their session
  timeout (then the coordinator expires them, and their next heartbeat joins the same id
  again, as a stalled real consumer's does).
"""

from __future__ import annotations

import msgspec

from quorumlog.raft.config import RaftConfig
from quorumlog.testing.history import History
from quorumlog.testing.sim.cluster import SimCluster, SimOptions
from quorumlog.testing.sim.events import derive_random, draw_int
from quorumlog.testing.sim.groups.checks import GroupChecker
from quorumlog.testing.sim.groups.client import SESSION_TIMEOUT_MS, SimConsumer, pick
from quorumlog.testing.sim.groups.coordinator import coordinator_application
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.trace import TraceRecorder

TOPICS = {"orders": 4, "events": 3}


class GroupWorldOptions(msgspec.Struct, frozen=True):
    groups: dict[str, list[list[str]]] = msgspec.field(
        default_factory=lambda: {
            "billing": [["events", "orders"]] * 3,
            "audit": [["orders"], ["events", "orders"]],
        }
    )
    """Group → one subscription per consumer."""
    network: NetworkFaults = NetworkFaults()
    raft: RaftConfig = RaftConfig(node_id="template")
    feature_levels: dict[str, int] | None = None
    """Node id → the feature level of the release it runs (a rolling upgrade caught half
    way: coordinator.py); None: every node runs this release."""
    session_7_nodes: frozenset[str] = frozenset()
    """Nodes on the session-7 release, the one before this (coordinator.py): give them
    level 1 in `feature_levels`, as they say no level."""


class GroupWorld:
    def __init__(
        self, seed: int, options: GroupWorldOptions, trace: TraceRecorder | None = None
    ) -> None:
        self.seed = seed
        self.options = options
        self.trace = trace
        self.checker = GroupChecker()
        self.history = History()
        self.cluster = SimCluster(
            seed,
            SimOptions(node_count=3, raft=options.raft, network=options.network),
            trace,
            coordinator_application(
                TOPICS,
                self.checker.executed,
                None if options.feature_levels is None else dict(options.feature_levels),
                options.session_7_nodes,
            ),
        )
        self.events = self.cluster.events
        self.rng = derive_random(seed, "group-consumers")
        node_ids = sorted(self.cluster.nodes)
        self.consumers: dict[str, SimConsumer] = {}
        for group, subscriptions in sorted(options.groups.items()):
            for number, topics in enumerate(subscriptions, start=1):
                name = f"{group}-c{number}"
                self.consumers[name] = SimConsumer(
                    name,
                    group,
                    topics,
                    seed=seed,
                    events=self.events,
                    frames=self.cluster.frames,
                    node_ids=node_ids,
                    checker=self.checker,
                    history=self.history,
                )
        self.consumer_faults = 0
        self.disturbing = False

    @property
    def now_ms(self) -> int:
        return self.events.now_ms

    def note(self, text: str) -> None:
        if self.trace is not None:
            self.trace.record(self.now_ms, text)

    def start(self) -> None:
        for number, name in enumerate(sorted(self.consumers)):
            consumer = self.consumers[name]
            self.events.schedule(200 + 150 * number, join_consumer, consumer)

    # --- the consumers' nemesis -------------------------------------------------------------

    def start_disturbing(self) -> None:
        self.disturbing = True
        self.events.schedule(draw_int(self.rng, 500, 2000), self.disturb)

    def stop_disturbing(self) -> None:
        self.disturbing = False
        for consumer in self.consumers.values():
            consumer.resume()
            if not consumer.active:
                consumer.join()

    def disturb(self, _: object) -> None:
        if not self.disturbing:
            return
        consumer = self.consumers[pick(self.rng, sorted(self.consumers))]
        kind = pick(self.rng, ["leave", "crash", "silent", "silent_expired"])
        self.consumer_faults += 1
        if kind in ("leave", "crash") and consumer.active:
            self.note(f"{consumer.name} {kind}")
            if kind == "leave":
                consumer.leave()
            else:
                consumer.crash()
            self.events.schedule(draw_int(self.rng, 200, 3000), lambda _: self.rejoin(consumer))
        elif not consumer.process.paused:
            session_ms = SESSION_TIMEOUT_MS
            low, high = (100, session_ms // 2) if kind == "silent" else (session_ms, 3 * session_ms)
            silent_ms = draw_int(self.rng, low, high)
            self.note(f"{consumer.name} silent for {silent_ms} ms")
            consumer.pause()
            self.events.schedule(silent_ms, lambda _: consumer.resume())
        self.events.schedule(draw_int(self.rng, 300, 2500), self.disturb)

    def rejoin(self, consumer: SimConsumer) -> None:
        if self.disturbing and not consumer.active:
            self.note(f"{consumer.name} joins again")
            consumer.join()

    # --- views ------------------------------------------------------------------------------

    def settled(self) -> bool:
        """Every consumer active, reading what the coordinator's leader assigns it, and no
        group rebalancing."""
        leader = self.cluster.leader()
        if leader is None:
            return False
        machine = self.cluster.node(leader).machine
        groups = getattr(machine, "groups", {})
        for consumer in self.consumers.values():
            state = groups.get(consumer.group)
            if not consumer.active or state is None or consumer.revoking:
                return False
            member = state.members.get(consumer.member_id)
            if member is None or member.revoking or any(m.revoking for m in state.members.values()):
                return False
            if consumer.applied.generation != state.generation:
                return False
            if consumer.applied.assignment != frozenset(member.assignment):
                return False
        return True

    def describe(self) -> str:
        lines = [consumer.describe() for _, consumer in sorted(self.consumers.items())]
        lines.append(self.cluster.describe())
        return "\n".join(lines)


def join_consumer(consumer: SimConsumer) -> None:
    consumer.join()
