"""Stream the flights into the topic, killing one partition's leader half way.

At the half-way record the leader of partition 0 gets SIGKILL while batches are in flight
to it; the producer keeps sending. Its batches for that partition fail over to the new
leader with their original sequences, which the partition uses to drop any batch the old
leader had already committed — so a record is never written twice, and none is lost.

Meanwhile a thread watches the partition elect a new leader, restarts the killed node as
it was launched (same id, address and data directory) and waits until the node is back in
the partition's in-sync set: the cluster ends the run whole, and the run shows recovery.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from quorumlog.demo.cluster import CLUSTER_ID, DemoCluster, KilledNode, wait_until
from quorumlog.errors import ClientError
from quorumlog.kv.client import KVClient
from quorumlog.stream.client_admin import Admin
from quorumlog.stream.producer import Producer
from quorumlog.stream.records import RecordMetadata

ELECTION_TIMEOUT_SECONDS = 30.0
CATCH_UP_TIMEOUT_SECONDS = 60.0
ADMIN_ATTEMPT_TIMEOUT_SECONDS = 1.0
"""Per attempt: a status request to the killed node should give up quickly and go on to
another replica, not wait out the whole request timeout."""
FLUSH_TIMEOUT_SECONDS = 120.0
PRODUCER_CLOSE_SECONDS = 1.0
FAILOVER_KEY = "demo/failover"

Progress = Callable[[int, int], None]
"""Called with (records sent, records acknowledged) now and then."""


@dataclass
class FailoverReport:
    partition: int
    killed_node: str | None = None
    killed_at_record: int | None = None
    new_leader: str | None = None
    election_seconds: float | None = None
    restarted: bool = False
    in_sync_seconds: float | None = None
    """From the kill until the restarted node is back in the partition's in-sync set."""
    error: str | None = None

    def describe(self) -> str:
        if self.killed_node is None:
            return f"no leader of partition {self.partition} was killed ({self.error})"
        parts = [
            f"killed {self.killed_node} (leader of partition {self.partition}) "
            f"at record {self.killed_at_record:,}"
        ]
        if self.new_leader is not None and self.election_seconds is not None:
            parts.append(f"{self.new_leader} leads after {self.election_seconds:.1f} s")
        if self.restarted and self.in_sync_seconds is not None:
            parts.append(
                f"{self.killed_node} restarted, in sync after {self.in_sync_seconds:.1f} s"
            )
        elif self.restarted:
            parts.append(f"{self.killed_node} restarted")
        else:
            parts.append(f"{self.killed_node} left down")
        if self.error:
            parts.append(f"({self.error})")
        return "; ".join(parts)


@dataclass
class ProduceReport:
    sent: int
    acknowledged: int
    failed: int
    distinct_positions: int
    """Distinct (partition, offset) pairs among the acknowledgements: equal to
    `acknowledged` unless two records were acknowledged at the same place."""
    failures: list[str] = field(default_factory=list)
    failover: FailoverReport | None = None


class LeaderFailover:
    """Kills a partition's leader, then (in a thread) follows its replacement and recovery."""

    def __init__(
        self, cluster: DemoCluster, topic: str, partition: int, on_over: Callable[[], None]
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.on_over = on_over
        """Called once the failover is over (recovered or given up), from either thread."""
        self.report = FailoverReport(partition)
        self.thread: threading.Thread | None = None
        self.admin = Admin(
            cluster.endpoints,
            cluster_id=CLUSTER_ID,
            attempt_timeout_seconds=ADMIN_ATTEMPT_TIMEOUT_SECONDS,
        )

    def leader(self) -> str | None:
        description = self.admin.describe_topic(self.topic)
        return description.partitions[self.partition].leader

    def kill_leader(self, record_number: int) -> None:
        try:
            leader = wait_until(self.leader, ELECTION_TIMEOUT_SECONDS, "a partition leader")
            killed = self.cluster.kill(leader)
        except (ClientError, TimeoutError) as error:
            self.report.error = str(error)
            self.on_over()
            return
        self.report.killed_node = leader
        self.report.killed_at_record = record_number
        self.thread = threading.Thread(
            target=self.recover, args=(killed, time.monotonic()), name="demo-failover"
        )
        self.thread.start()

    def recover(self, killed: KilledNode, killed_seconds: float) -> None:
        try:
            self.report.new_leader = wait_until(
                lambda: self.new_leader(killed.node_id), ELECTION_TIMEOUT_SECONDS, "a new leader"
            )
            self.report.election_seconds = time.monotonic() - killed_seconds
            if self.cluster.restart(killed) is None:
                self.report.error = "its command line is unknown (no /proc), so it stays down"
                return
            self.report.restarted = True
            self.record_in_kv()
            wait_until(
                lambda: self.back_in_sync(killed.node_id),
                CATCH_UP_TIMEOUT_SECONDS,
                f"{killed.node_id} back in sync",
            )
            self.report.in_sync_seconds = time.monotonic() - killed_seconds
        except (ClientError, TimeoutError) as error:
            self.report.error = str(error)
        finally:
            self.on_over()

    def record_in_kv(self) -> None:
        """Note the failover in the KV (FAILOVER_KEY).

        The write also wakes the metadata group, which a restarted follower needs today:
        while that group is idle, its leader only sends heartbeats, and a follower that
        lost its place by restarting does not learn the commit index from them; so it never
        applies the topic list, never hosts its partitions, and never catches up. A new
        entry makes the leader compare logs with it again."""
        with KVClient(self.cluster.endpoints, cluster_id=CLUSTER_ID) as kv:
            kv.put(FAILOVER_KEY, json.dumps(dataclasses.asdict(self.report)))

    def new_leader(self, killed_node: str) -> str | None:
        leader = self.leader()
        return leader if leader is not None and leader != killed_node else None

    def back_in_sync(self, node_id: str) -> bool | None:
        description = self.admin.describe_topic(self.topic).partitions[self.partition]
        return True if node_id in description.in_sync else None

    def finish(self, timeout_seconds: float) -> FailoverReport:
        if self.thread is not None:
            self.thread.join(timeout_seconds)
            if self.thread.is_alive():
                self.report.error = f"recovery still running after {timeout_seconds:g}s"
        self.admin.close()
        return self.report


class AcknowledgementCounter:
    """Counts futures as they complete (on the producer's I/O thread: one add, no lock —
    only that thread writes, and readers want a progress figure, not an exact one)."""

    def __init__(self) -> None:
        self.count = 0

    def done(self, future: Future[RecordMetadata]) -> None:
        self.count += 1


PROGRESS_EVERY_RECORDS = 2_000
FAILURES_SHOWN_MAX = 5


def produce_records(
    cluster: DemoCluster,
    topic: str,
    records: list[tuple[bytes, bytes]],
    progress: Progress,
    kill_partition: int | None = 0,
    on_failover_over: Callable[[], None] = lambda: None,
) -> ProduceReport:
    """Send every (key, value) to `topic`, kill a leader half way, wait for every answer.

    `on_failover_over` is called when the killed node is back (or the failover gave up):
    from then on every node serves the cluster's metadata again."""
    counter = AcknowledgementCounter()
    futures: list[Future[RecordMetadata]] = []
    failover = None
    if kill_partition is not None:
        failover = LeaderFailover(cluster, topic, kill_partition, on_failover_over)
    half_way = len(records) // 2
    failover_report = None
    producer = Producer(cluster.endpoints, cluster_id=CLUSTER_ID)
    try:
        for number, (key, value) in enumerate(records):
            if number == half_way and failover is not None:
                failover.kill_leader(number)
            future = producer.send(topic, value, key=key)
            future.add_done_callback(counter.done)
            futures.append(future)
            if number % PROGRESS_EVERY_RECORDS == 0:
                progress(number + 1, counter.count)
        producer.flush(FLUSH_TIMEOUT_SECONDS)
        progress(len(records), counter.count)
    finally:
        # Not `with producer`: its close() flushes without a deadline, and after a flush
        # that timed out that would wait for ever.
        producer.close(timeout=PRODUCER_CLOSE_SECONDS)
        if failover is not None:
            failover_report = failover.finish(CATCH_UP_TIMEOUT_SECONDS)
    report = settle(futures)
    report.failover = failover_report
    return report


def settle(futures: list[Future[RecordMetadata]]) -> ProduceReport:
    positions: set[tuple[int, int]] = set()
    failures: list[str] = []
    acknowledged = 0
    for future in futures:
        error = future.exception(timeout=0) if future.done() else TimeoutError("no answer")
        if error is not None:
            if len(failures) < FAILURES_SHOWN_MAX:
                failures.append(f"{type(error).__name__}: {error}")
            continue
        metadata = future.result()
        positions.add((metadata.partition, metadata.offset))
        acknowledged += 1
    return ProduceReport(
        sent=len(futures),
        acknowledged=acknowledged,
        failed=len(futures) - acknowledged,
        distinct_positions=len(positions),
        failures=failures,
    )
