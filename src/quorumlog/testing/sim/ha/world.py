"""One seed's controller-mode world: a Raft controller, a broker group, a producer.

- the controller: `SimCluster` nodes n1..n3 running the shipped HA controller machine and
  service (controller.py);
- the brokers b1..bN: the shipped `BrokerHost` on simulated disks (broker.py), talking to
  the controller over the frame network and to each other over `SimHALinks`;
- the producer: sends produces of unique messages (never retried, so a message held twice
  is a duplicate) to the broker it believes is master; a refusal or a silence sends the
  next one elsewhere. A produce is acknowledged when the master's host completes it.

One set of cut links (`blocked`) serves the Raft network, the frame network, the HA links
and the producer, so one partition cuts every kind of traffic.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from quorumlog.errors import QuorumLogError
from quorumlog.ha.broker_host import BrokerHostConfig
from quorumlog.ha.replication_actions import HAReplicationConfig
from quorumlog.raft.config import RaftConfig
from quorumlog.runtime.completion import Completion
from quorumlog.testing.sim.cluster import SimCluster, SimOptions
from quorumlog.testing.sim.events import derive_random, draw_int
from quorumlog.testing.sim.ha.broker import SimBroker
from quorumlog.testing.sim.ha.checks import HAChecker
from quorumlog.testing.sim.ha.controller import ObservedControllerMachine, controller_application
from quorumlog.testing.sim.ha.links import SimHALinks
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.process import SimProcess
from quorumlog.testing.sim.trace import TraceRecorder

PRODUCER = "producer"
PRODUCE_TIMEOUT_MS = 600


class HAWorldOptions(msgspec.Struct, frozen=True):
    broker_count: int = 3
    heartbeat_timeout_ms: int = 1000
    network: NetworkFaults = NetworkFaults()
    link_break_probability: float = 0.0
    replication: HAReplicationConfig = HAReplicationConfig(
        transfer_batch_bytes_max=2048,
        inflight_bytes_max=8192,
        heartbeat_interval_ms=100,
        ha_max_time_slave_not_catch_up_ms=800,
        alter_retry_interval_ms=300,
        min_in_sync=2,
    )
    produce_interval_ms: int = 10
    produce_batch_max: int = 3


class HAWorld:
    def __init__(self, seed: int, options: HAWorldOptions, trace: TraceRecorder | None) -> None:
        self.seed = seed
        self.options = options
        self.trace = trace
        self.checker = HAChecker()
        self.cluster = SimCluster(
            seed,
            SimOptions(node_count=3, raft=RaftConfig(node_id="template"), network=options.network),
            trace,
            controller_application(options.heartbeat_timeout_ms, self.checker.controller_applied),
        )
        self.events = self.cluster.events
        self.blocked = self.cluster.network.blocked
        self.links = SimHALinks(
            self.events,
            derive_random(seed, "ha-links"),
            self.blocked,
            break_probability=options.link_break_probability,
        )
        config = BrokerHostConfig(
            replication=options.replication,
            tick_seconds=0.02,
            controller_heartbeat_seconds=0.2,
            reconnect_seconds=0.1,
        )
        node_ids = list(self.cluster.nodes)
        self.brokers: dict[str, SimBroker] = {}
        for number in range(1, options.broker_count + 1):
            name = f"b{number}"
            broker = SimBroker(
                name, seed, self.events, self.cluster.frames, self.links, node_ids, config
            )
            broker.on_role_changed = self.role_changed
            broker.on_truncated = self.truncated
            self.brokers[name] = broker
        self.producer = SimProcess(PRODUCER, self.events, derive_random(seed, "producer-resume"))
        self.producer.boot()
        self.producer_random = derive_random(seed, "producer")
        self.target = "b1"
        self.next_message = 0
        self.producing = False
        self.produced = 0
        self.refused = 0
        self.unknown = 0
        self.acknowledged_replies = 0
        self.awaiting: set[bytes] = set()
        """The first message of each produce sent and not yet answered."""

    @property
    def now_ms(self) -> int:
        return self.events.now_ms

    def start(self) -> None:
        for number, broker in enumerate(self.brokers.values()):
            # Registration order decides the first master: start them apart.
            self.events.schedule(300 + 50 * number, start_broker, broker)

    def note(self, text: str) -> None:
        if self.trace is not None:
            self.trace.record(self.now_ms, text)

    # --- checks hooked on the brokers --------------------------------------------------

    def role_changed(self, broker: SimBroker) -> None:
        host = broker.host
        if host is None:
            return
        self.note(f"{broker.name} role {host.status().role} at epoch {host.role_epoch}")
        self.checker.role_taken(broker.name, host.role_epoch, host.master is not None, broker.log)

    def truncated(self, broker: SimBroker) -> None:
        host = broker.host
        if host is None or host.slave is None or broker.log is None or broker.epochs is None:
            return
        master = self.brokers.get(host.slave.master_id)
        if master is None or master.host is None or master.log is None or master.epochs is None:
            return
        core = master.host.master
        if core is None or core.master_epoch != host.slave.master_epoch:
            return  # the master moved on since it answered; its log may differ now
        self.checker.handshake_done(
            broker.name,
            broker.log,
            broker.epochs.entries,
            master.name,
            master.log,
            master.epochs.entries,
        )

    # --- the producer ------------------------------------------------------------------

    def start_producing(self) -> None:
        self.producing = True
        self.producer.schedule(1, self.produce_next)

    def stop_producing(self) -> None:
        self.producing = False

    def produce_next(self, _: object = None) -> None:
        if not self.producing:
            return
        rng = self.producer_random
        count = draw_int(rng, 1, self.options.produce_batch_max)
        messages = [b"m%07d" % (self.next_message + offset) for offset in range(count)]
        self.next_message += count
        self.produced += count
        self.send_produce(self.target, messages)
        self.producer.schedule(self.options.produce_interval_ms, self.produce_next)

    def send_produce(self, target: str, messages: list[bytes]) -> None:
        # No answer in time (a partition, a master that can no longer acknowledge): the
        # outcome is unknown and the producer looks elsewhere, as a real client does.
        self.awaiting.add(messages[0])
        self.producer.schedule(PRODUCE_TIMEOUT_MS, self.produce_lost, (target, messages[0]))
        if (PRODUCER, target) in self.blocked:
            return
        broker = self.brokers[target]
        delay_ms = draw_int(self.producer_random, 1, 3)

        def arrive(_: object) -> None:
            broker.process.enter(f"rpc:{PRODUCER}", self.produce_at, (broker, messages))

        self.events.schedule(delay_ms, arrive)

    def produce_at(self, argument: tuple[SimBroker, list[bytes]]) -> None:
        broker, messages = argument
        host = broker.host
        if host is None:
            return
        epoch = host.role_epoch
        completion = host.produce(messages)

        def done(finished: Completion[int]) -> None:
            error = finished.exception()
            if error is None:
                self.checker.acknowledged_messages(epoch, messages)
            hint = host.view.master_id if host.view is not None else None
            if host.failure is not None:
                # It stepped out: the view it last had names itself. A node refusing then
                # names no one (node/ha_topics.py, refuse_not_master).
                hint = None
            self.reply(broker.name, messages[0], error, hint)

        completion.add_done_callback(done)

    def reply(
        self, source: str, first: bytes, error: BaseException | None, hint: str | None
    ) -> None:
        if (source, PRODUCER) in self.blocked:
            return

        def arrive(_: object) -> None:
            self.producer.enter(f"rpc:{source}", self.answered, (source, first, error, hint))

        self.events.schedule(draw_int(self.producer_random, 1, 3), arrive)

    def answered(self, argument: tuple[str, bytes, BaseException | None, str | None]) -> None:
        source, first, error, hint = argument
        if first not in self.awaiting:
            return  # answered after the producer gave up on it
        self.awaiting.discard(first)
        if error is None:
            self.acknowledged_replies += 1
            return
        if not isinstance(error, QuorumLogError):
            raise error
        self.refused += 1
        if source == self.target:
            self.target = hint if hint in self.brokers else self.random_broker()

    def produce_lost(self, argument: tuple[str, bytes]) -> None:
        target, first = argument
        if first not in self.awaiting:
            return
        self.awaiting.discard(first)
        self.unknown += 1
        if target == self.target:
            self.target = self.random_broker()

    def random_broker(self) -> str:
        return self.producer_random.choice(sorted(self.brokers))

    # --- faults ------------------------------------------------------------------------

    def isolate(self, name: str, keep: Callable[[str], bool] = lambda other: False) -> None:
        """Cut `name` from every broker, controller node and the producer but those kept."""
        others = [*self.brokers, *self.cluster.nodes, PRODUCER]
        for other in others:
            if other != name and not keep(other):
                self.blocked.add((name, other))
                self.blocked.add((other, name))
        self.links.cut()
        self.note(f"isolate {name}")

    def slow_links_from(self, name: str, delay_ms: int) -> None:
        """Every HA frame `name` sends from now on arrives `delay_ms` later."""
        self.links.extra_delay_ms[name] = delay_ms
        self.note(f"slow links from {name} by {delay_ms} ms")

    def heal_network(self) -> None:
        self.blocked.clear()
        self.links.extra_delay_ms.clear()
        self.note("heal network")

    def controller_leader(self) -> str | None:
        return self.cluster.leader()

    def master(self) -> SimBroker | None:
        """The broker the controller's leader names master, if it is up and knows it."""
        leader = self.controller_leader()
        if leader is None:
            return None
        machine = self.cluster.node(leader).machine
        if not isinstance(machine, ObservedControllerMachine):
            return None
        info = machine.group_info("ha-group")
        if info is None or info.master_id is None:
            return None
        broker = self.brokers[info.master_id]
        host = broker.host
        if host is None or host.master is None or host.master.master_epoch != info.master_epoch:
            return None
        return broker

    def describe(self) -> str:
        lines = [broker.describe() for broker in self.brokers.values()]
        lines.append(self.cluster.describe())
        return "\n".join(lines)


def start_broker(broker: SimBroker) -> None:
    broker.start()
