"""`quorumlog bench scale`: what many Raft groups cost a node, idle and busy.

Three `quorumlog node` processes on loopback (fsync on). Topics are created one after
another, each replicated on all three nodes (so every node hosts every partition), and
kept: the groups add up (1 + 3 + 100 + 1000 partitions by default). Per topic, one JSON
line ("phase": "partitions"):

- `seconds_to_create`: from the create request until one record was acknowledged on
  every partition (every partition elected a leader and commits);
- `idle_cores`: CPU of the three processes together (user + system, from /proc) over
  `--idle-seconds` once the cluster has settled for `--settle-seconds` after the create;
- `rss_mb_per_node`: the nodes' mean resident set size (VmRSS) after that idle period;
- `produce_records_per_s`: `--produce-records` 100-byte records (default 1,000,000) spread
  round robin over all the topic's partitions by one `Producer`, from the first send to the
  last acknowledgement; `produce_batches`: the produce requests answered meanwhile (retries
  not counted); `produce_node_cpu_seconds` and `produce_client_cpu_seconds`: the CPU the
  three nodes together and this process (the producer) used meanwhile, the figures that
  say what a partition costs on a machine where everything shares two cores;
  `load_average_1m`: the machine's load then (the figures are only as quiet as it was).

  A million records, not a hundred thousand (until session 10): spread over 1,000
  partitions, 100,000 records are 100 a partition, two batches each (the first leaves after
  the linger with one or two records), so the figure said how long two rounds over 1,000
  groups take rather than what the cluster sustains; a million records make it a rate.

Last line, one JSON object: `idle_cores_1_partition`, `idle_cores_1000_partitions`,
`rss_mb_per_1000_groups` (node RSS growth from the 1-partition to the 1000-partition
phase, per 1000 groups added), `produce_records_per_s_1000_partitions`,
`produce_records_per_s_3_partitions`, `produce_ratio_1000_to_3_partitions` (the first over
the second), `seconds_to_create_1000_partitions`, `produce_records`, and the groups each node
hosted at the end. Figures, never pass or fail.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec

from quorumlog.bench.kv_processes import BenchError, NodeCluster, cpu_seconds

VALUE_BYTES = 100
CLUSTER_ID = "bench-scale"
CREATE_TIMEOUT_SECONDS = 120.0
ADMIN_RETRY_SECONDS = 0.1


class ScaleSettings(msgspec.Struct, frozen=True):
    partition_counts: tuple[int, ...] = (1, 3, 100, 1000)
    idle_seconds: float = 10.0
    settle_seconds: float = 3.0
    produce_records: int = 1_000_000
    directory: str | None = None
    quiesce_idle_ticks: int | None = None
    """The nodes' `--quiesce-idle-ticks` (None: the node's default)."""


QUICK_SETTINGS = ScaleSettings(
    partition_counts=(1, 3, 10, 50),
    idle_seconds=2.0,
    settle_seconds=1.0,
    produce_records=5_000,
)


class ScaleCluster(NodeCluster):
    def __init__(self, directory: Path, settings: ScaleSettings) -> None:
        super().__init__(directory, 3, CLUSTER_ID)
        self.quiesce_idle_ticks = settings.quiesce_idle_ticks

    def extra_node_arguments(self, node_id: str) -> list[str]:
        if self.quiesce_idle_ticks is None:
            return []
        return ["--quiesce-idle-ticks", str(self.quiesce_idle_ticks)]


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line, sort_keys=True), flush=True)


def rss_megabytes(pid: int) -> float:
    """The process's resident set size now (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise BenchError(f"no VmRSS in /proc/{pid}/status")


def idle_cores(pids: list[int], seconds: float) -> float:
    """CPU cores the processes used together over `seconds` of wall time."""
    before = sum(cpu_seconds(pid) for pid in pids)
    started = time.monotonic()
    time.sleep(seconds)  # the measurement window itself, not a wait for a condition
    elapsed = time.monotonic() - started
    return (sum(cpu_seconds(pid) for pid in pids) - before) / elapsed


def create_and_reach_every_partition(endpoints: list[str], topic: str, partitions: int) -> float:
    """Seconds from the create request until a record is acknowledged on every partition."""
    from quorumlog import Admin, Producer
    from quorumlog.errors import QuorumLogError

    started = time.perf_counter()
    deadline = time.monotonic() + CREATE_TIMEOUT_SECONDS
    admin = Admin(endpoints, cluster_id=CLUSTER_ID)
    try:
        while True:
            try:
                admin.create_topic(topic, partitions=partitions, replication=3)
                break
            except QuorumLogError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(ADMIN_RETRY_SECONDS)  # no metadata leader yet: ask again
    finally:
        admin.close()
    producer = Producer(endpoints, cluster_id=CLUSTER_ID)
    try:
        waiting = set(range(partitions))
        while waiting:
            futures: dict[int, Future[Any]] = {
                partition: producer.send(topic, b"x" * VALUE_BYTES, partition=partition)
                for partition in sorted(waiting)
            }
            for partition, future in futures.items():
                remaining = max(deadline - time.monotonic(), 0.001)
                try:
                    future.result(timeout=remaining)
                    waiting.discard(partition)
                except QuorumLogError:
                    pass  # not hosted or not elected yet: sent again below
                except TimeoutError as error:
                    raise BenchError(f"{topic}: partition {partition} never answered") from error
            if waiting and time.monotonic() > deadline:
                raise BenchError(f"{topic}: {len(waiting)} partitions not reachable")
    finally:
        producer.close()
    return time.perf_counter() - started


class ProduceFigures(msgspec.Struct, frozen=True):
    records_per_second: float
    batches: int
    """Produce requests answered (how many round trips the records took)."""
    node_cpu_seconds: float
    """The three nodes together, from the first send to the last acknowledgement."""
    client_cpu_seconds: float
    """This process (the producer's threads), over the same time."""


def produce_spread(
    endpoints: list[str], pids: list[int], topic: str, partitions: int, records: int
) -> ProduceFigures:
    """Send `records` round robin over every partition until all are acknowledged."""
    from quorumlog import Producer

    producer = Producer(endpoints, cluster_id=CLUSTER_ID)
    value = b"x" * VALUE_BYTES
    futures: list[Future[Any]] = []
    try:
        node_cpu_before = sum(cpu_seconds(pid) for pid in pids)
        client_cpu_before = time.process_time()
        started = time.perf_counter()
        futures = [
            producer.send(topic, value, partition=number % partitions) for number in range(records)
        ]
        producer.flush()
        elapsed = time.perf_counter() - started
        client_cpu = time.process_time() - client_cpu_before
        node_cpu = sum(cpu_seconds(pid) for pid in pids) - node_cpu_before
    finally:
        producer.close()
    failed = sum(1 for future in futures if future.exception() is not None)
    if failed:
        raise BenchError(f"{failed} of {records} records to {topic} failed")
    return ProduceFigures(
        records_per_second=records / elapsed,
        batches=producer.batches_sent,
        node_cpu_seconds=node_cpu,
        client_cpu_seconds=client_cpu,
    )


def run_phase(cluster: NodeCluster, partitions: int, settings: ScaleSettings) -> dict[str, Any]:
    endpoints = cluster.endpoints
    pids = list(cluster.pids.values())
    topic = f"scale-{partitions}"
    seconds_to_create = create_and_reach_every_partition(endpoints, topic, partitions)
    time.sleep(settings.settle_seconds)  # let elections and catch-up finish: the idle state
    cores = idle_cores(pids, settings.idle_seconds)
    rss = [rss_megabytes(pid) for pid in pids]
    produce = produce_spread(endpoints, pids, topic, partitions, settings.produce_records)
    return {
        "phase": "partitions",
        "partitions": partitions,
        "seconds_to_create": round(seconds_to_create, 2),
        "idle_cores": round(cores, 4),
        "rss_mb_per_node": round(sum(rss) / len(rss), 1),
        "produce_records": settings.produce_records,
        "produce_records_per_s": round(produce.records_per_second),
        "produce_batches": produce.batches,
        "produce_node_cpu_seconds": round(produce.node_cpu_seconds, 2),
        "produce_client_cpu_seconds": round(produce.client_cpu_seconds, 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def summarize(phases: list[dict[str, Any]], groups_per_node: int) -> dict[str, Any]:
    by_count = {phase["partitions"]: phase for phase in phases}
    smallest = by_count[min(by_count)]
    largest_count = max(by_count)
    largest = by_count[largest_count]
    groups_added = sum(count for count in by_count if count > min(by_count))
    rss_growth = largest["rss_mb_per_node"] - smallest["rss_mb_per_node"]
    summary: dict[str, Any] = {
        "idle_cores_1_partition": smallest["idle_cores"],
        f"idle_cores_{largest_count}_partitions": largest["idle_cores"],
        "rss_mb_per_1000_groups": round(rss_growth * 1000 / max(groups_added, 1), 1),
        f"produce_records_per_s_{largest_count}_partitions": largest["produce_records_per_s"],
        f"seconds_to_create_{largest_count}_partitions": largest["seconds_to_create"],
        "groups_per_node": groups_per_node,
    }
    if 3 in by_count:
        three = by_count[3]["produce_records_per_s"]
        summary["produce_records_per_s_3_partitions"] = three
        if largest_count != 3 and three:
            summary[f"produce_ratio_{largest_count}_to_3_partitions"] = round(
                largest["produce_records_per_s"] / three, 3
            )
    summary["produce_records"] = largest["produce_records"]
    return summary


def run_scale_benchmark(settings: ScaleSettings) -> None:
    directory = Path(settings.directory or tempfile.mkdtemp(prefix="quorumlog-bench-scale-"))
    directory.mkdir(parents=True, exist_ok=True)
    cluster = ScaleCluster(directory, settings)
    phases: list[dict[str, Any]] = []
    try:
        cluster.start()
        for partitions in settings.partition_counts:
            phases.append(run_phase(cluster, partitions, settings))
            emit(phases[-1])
    finally:
        cluster.stop()
        if settings.directory is None:
            shutil.rmtree(directory, ignore_errors=True)
    emit(summarize(phases, groups_per_node=1 + sum(settings.partition_counts)))
