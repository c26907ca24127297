"""`quorumlog bench ha`: produce to an HA-replicated topic beside a Raft topic and a ledger
topic on the same nodes, and failover time (issue 12, "Benchmark").

    quorumlog bench ha --json [--quick] [--rounds N] [--dir DIR]

Setup: 3 `quorumlog node` processes on loopback, fsync on, each hosting a bookie (so the
ledger topic writes to them). One one-partition topic of each storage, replicated 3 ways
(the HA topic: a broker group of 3, min_in_sync 2, acknowledged once every SyncStateSet
member has a produce; the ledger topic: E=3, Qw=2, Qa=2).

Cases, one JSON object each:

- `produce-<storage>`: one `Producer` (the `bench stream` produce path) sends RECORDS
  100-byte records as fast as it takes them; records/s from the first send to the last
  acknowledgement. CPU per record of the nodes (all three) and of this client beside it:
  a client near one core's worth per record is what bounds the rate, not the storage
  (`client_cpu_share`: the client's CPU seconds over the case's seconds; its Python
  threads share one interpreter lock, so near 1.0 the client is the limit). The summary
  gives the HA cases' medians (`ha_client_cpu_us_per_record`, `ha_node_cpu_us_per_record`,
  `ha_client_cpu_share`).
  The three storages take turns, `--rounds` times (3 by default, 1 with --quick): on a
  shared machine the load drifts between cases, and a ratio of two runs taken seconds
  apart, repeated, says more than one taken once. The summary gives the median rates and
  the median of the rounds' HA/Raft ratios (each round's ratio in
  `ratio_ha_to_raft_produce_rounds`).
- `latency-<storage>`: one `send` per record at PACED_RECORDS_PER_SECOND (open loop: the
  schedule does not wait for answers); p50/p99 from send to acknowledgement.
- `failover`: a paced producer runs against the HA topic; the master's process is
  SIGKILLed; the figure is the seconds from the kill to the acknowledgement of the first
  record sent after it (so it was written by the new master). The controller declares a
  master dead after BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT of silence, which dominates; when
  the master's node also led the controller (`controller_leader_killed`), the controller
  election overlaps that silence (the new leader skips its grace for a master whose node
  it sees unreachable, node/ha_controller_service.py).

The last line sums it up: produce_records_per_s (the HA topic), ratio_ha_to_raft_produce,
failover_seconds and the rest. Figures, never pass or fail; the load average at the start
of each case is in its line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from quorumlog.bench.kv_processes import BenchError, NodeCluster, cpu_seconds, request_once
from quorumlog.ha.controller_machine import BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT
from quorumlog.stream.records import RecordMetadata

CLUSTER_ID = "bench-ha"
VALUE_BYTES = 100
RECORDS = 300_000
RECORDS_QUICK = 5_000
PACED_RECORDS_PER_SECOND = 2_000.0
"""A moderate rate: each storage keeps up with it, so latency is not queueing."""
PACE_TICK_SECONDS = 0.002
FAILOVER_PACE_SECONDS = 0.002
"""How often the failover case sends a record (so the first after the kill is found
within this)."""
SETUP_TIMEOUT_SECONDS = 30.0
FAILOVER_TIMEOUT_SECONDS = 30.0
STORAGES = ("ha", "raft", "ledger")
ROUNDS_DEFAULT = 3
TOPICS = {storage: f"bench-{storage}-topic" for storage in STORAGES}


class Settings:
    def __init__(
        self, quick: bool, directory: str | None, as_json: bool, rounds: int | None = None
    ) -> None:
        self.quick = quick
        self.directory = directory
        self.as_json = as_json
        self.records = RECORDS_QUICK if quick else RECORDS
        self.paced_seconds = 0.5 if quick else 3.0
        self.rounds = rounds if rounds is not None else (1 if quick else ROUNDS_DEFAULT)
        if self.rounds < 1:
            raise BenchError("--rounds must be at least 1")


def emit(line: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(line, sort_keys=True), flush=True)
    else:
        print("  ".join(f"{key}={value}" for key, value in line.items()), flush=True)


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def percentile_ms(sorted_seconds: list[float], fraction: float) -> float | None:
    if not sorted_seconds:
        return None
    index = min(int(len(sorted_seconds) * fraction), len(sorted_seconds) - 1)
    return round(sorted_seconds[index] * 1e3, 2)


def wait_for(condition: Callable[[], Any], timeout_seconds: float, what: str) -> Any:
    """Poll `condition` until it gives something truthy; BenchError at the deadline."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.02)


# --- setup --------------------------------------------------------------------------------


def create_topics(endpoints: list[str]) -> str:
    """The three topics; the HA topic's broker group, once all 3 brokers are in sync."""
    from quorumlog import Admin
    from quorumlog.errors import QuorumLogError
    from quorumlog.stream.topics import group_id

    with Admin(endpoints, cluster_id=CLUSTER_ID) as admin:

        def created() -> bool:
            try:
                admin.create_topic(TOPICS["raft"], partitions=1, replication=3)
            except QuorumLogError:
                return False  # the cluster is still electing its metadata leader
            return True

        wait_for(created, SETUP_TIMEOUT_SECONDS, "the metadata group to create a topic")
        admin.create_topic(TOPICS["ha"], partitions=1, replication=3, storage="ha")
        admin.create_topic(
            TOPICS["ledger"],
            partitions=1,
            replication=3,
            storage="ledger",
            ensemble=3,
            write_quorum=2,
            ack_quorum=2,
        )
        group = group_id(admin.topic_descriptor(TOPICS["ha"]), 0)

    def in_sync() -> bool:
        info = group_info(endpoints, group)
        return info is not None and len(info.sync_state_set) == 3

    wait_for(in_sync, SETUP_TIMEOUT_SECONDS, "all three HA brokers in the SyncStateSet")
    return group


def group_info(endpoints: list[str], group: str) -> Any:
    from quorumlog.errors import ClientError
    from quorumlog.ha.controller_client import HAControllerClient

    try:
        with HAControllerClient(endpoints, timeout=2.0, cluster_id=CLUSTER_ID) as client:
            return client.get_group(group)
    except (KeyError, ClientError):
        return None


# --- cases --------------------------------------------------------------------------------


def produce_case(
    endpoints: list[str], storage: str, pids: list[int], settings: Settings
) -> dict[str, Any]:
    from quorumlog.bench.stream import produce

    load = load_average()
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    client_cpu_before = time.process_time()
    seconds = produce(endpoints, TOPICS[storage], settings.records, 1, CLUSTER_ID)
    client_cpu_seconds = time.process_time() - client_cpu_before
    node_cpu_seconds = sum(cpu_seconds(pid) for pid in pids) - cpu_before
    return {
        "case": f"produce-{storage}",
        "records": settings.records,
        "value_bytes": VALUE_BYTES,
        "seconds": round(seconds, 3),
        "records_per_s": round(settings.records / seconds),
        "node_cpu_us_per_record": round(node_cpu_seconds / settings.records * 1e6, 2),
        "client_cpu_us_per_record": round(client_cpu_seconds / settings.records * 1e6, 2),
        "client_cpu_share": round(client_cpu_seconds / seconds, 2),
        "load_average_at_start": load,
    }


class TimedSend:
    """One record of the failover case: when it was sent and, once acknowledged, when."""

    __slots__ = ("acknowledged_at", "sent_at")

    def __init__(self, future: Future[RecordMetadata]) -> None:
        self.sent_at = time.perf_counter()
        self.acknowledged_at: float | None = None
        future.add_done_callback(self.done)

    def done(self, future: Future[RecordMetadata]) -> None:
        # Runs on the producer's I/O thread; one attribute store.
        if future.exception() is None:
            self.acknowledged_at = time.perf_counter()


def latency_case(endpoints: list[str], storage: str, settings: Settings) -> dict[str, Any]:
    from quorumlog import Producer

    load = load_average()
    records: list[TimedSend] = []
    value = b"x" * VALUE_BYTES
    with Producer(endpoints, cluster_id=CLUSTER_ID, linger_ms=0) as producer:
        producer.send(TOPICS[storage], value, partition=0).result(timeout=30)  # warm routes
        started = time.perf_counter()
        sent = 0
        while (now := time.perf_counter()) < started + settings.paced_seconds:
            due = int((now - started) * PACED_RECORDS_PER_SECOND) + 1
            for _ in range(due - sent):
                records.append(TimedSend(producer.send(TOPICS[storage], value, partition=0)))
            sent = due
            time.sleep(PACE_TICK_SECONDS)  # pacing the schedule, not waiting for an outcome
        producer.flush()
    # A future's callbacks run just after its waiters wake: wait for the last stamps.
    wait_for(
        lambda: all(record.acknowledged_at is not None for record in records),
        30,
        "every paced record to be acknowledged",
    )
    latencies = sorted(
        record.acknowledged_at - record.sent_at
        for record in records
        if record.acknowledged_at is not None
    )
    return {
        "case": f"latency-{storage}",
        "records_per_s_offered": PACED_RECORDS_PER_SECOND,
        "records": len(latencies),
        "p50_ms": percentile_ms(latencies, 0.50),
        "p99_ms": percentile_ms(latencies, 0.99),
        "max_ms": percentile_ms(latencies, 1.0),
        "load_average_at_start": load,
    }


def failover_case(nodes: NodeCluster, group: str) -> dict[str, Any]:
    """SIGKILL the HA master under a paced producer; seconds until a record sent after the
    kill is acknowledged."""
    from quorumlog import Producer

    load = load_average()
    before = wait_for(lambda: group_info(nodes.endpoints, group), 10, "the HA group")
    master = before.master_id
    if master is None:
        raise BenchError("the HA group has no master")
    live = [address for node, address in nodes.addresses.items() if node != master]
    controller_leader = ha_controller_leader(nodes)
    sent: list[TimedSend] = []
    stop = threading.Event()
    with Producer(nodes.endpoints, cluster_id=CLUSTER_ID, linger_ms=0) as producer:

        def send_paced() -> None:
            while not stop.is_set():
                future = producer.send(TOPICS["ha"], b"f" * VALUE_BYTES, partition=0)
                sent.append(TimedSend(future))
                stop.wait(FAILOVER_PACE_SECONDS)

        worker = threading.Thread(target=send_paced, daemon=True)
        worker.start()
        try:
            wait_for(lambda: acknowledged_count(sent) >= 100, 30, "acks before the kill")
            process = nodes.processes[master]
            killed_at = time.perf_counter()
            process.send_signal(signal.SIGKILL)
            process.wait()
            first = wait_for(
                lambda: first_acknowledged_after(sent, killed_at),
                FAILOVER_TIMEOUT_SECONDS,
                "an acknowledgement from the new master",
            )
        finally:
            stop.set()
            worker.join(timeout=10)
    after = wait_for(lambda: group_info(live, group), 10, "the HA group after the kill")
    return {
        "case": "failover",
        "old_master": master,
        "new_master": after.master_id,
        "master_epoch_before": before.master_epoch,
        "master_epoch_after": after.master_epoch,
        "controller_leader_killed": controller_leader == master,
        "broker_heartbeat_timeout_ms": BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT,
        "failover_seconds": round(first - killed_at, 3),
        "load_average_at_start": load,
    }


def ha_controller_leader(nodes: NodeCluster) -> str | None:
    """The node leading the "ha-controller" group now: when it is the master's node, the
    kill also costs a controller election and the new leader's wait of one heartbeat
    timeout before its first check (node/ha_controller_service.py)."""
    from quorumlog.codec.wire import HA_CONTROLLER_GROUP, StatusRequest, StatusResponse

    for node_id, address in nodes.addresses.items():
        request = StatusRequest(request_id=1, group=HA_CONTROLLER_GROUP)
        frame = request_once(address, CLUSTER_ID, request, 0.5, "bench-status")
        if isinstance(frame, StatusResponse) and frame.is_leader:
            return node_id
    return None


def acknowledged_count(sent: list[TimedSend]) -> int:
    return sum(1 for record in list(sent) if record.acknowledged_at is not None)


def first_acknowledged_after(sent: list[TimedSend], killed_at: float) -> float | None:
    """When the first record sent after `killed_at` was acknowledged (None: not yet). A
    partition acknowledges in order, so none sent later is acknowledged earlier."""
    for record in list(sent):
        if record.sent_at > killed_at:
            return record.acknowledged_at
    return None


# --- the run ------------------------------------------------------------------------------


def run_cases(nodes: NodeCluster, settings: Settings) -> dict[str, Any]:
    endpoints = nodes.endpoints
    summary: dict[str, Any] = {"case": "summary", "load_average": load_average()}
    group = create_topics(endpoints)
    pids = list(nodes.pids.values())
    rates: dict[str, list[int]] = {storage: [] for storage in STORAGES}
    ha_lines: list[dict[str, Any]] = []
    for round_number in range(settings.rounds):
        for storage in STORAGES:
            line = produce_case(endpoints, storage, pids, settings)
            line["round"] = round_number
            emit(line, settings.as_json)
            rates[storage].append(line["records_per_s"])
            if storage == "ha":
                ha_lines.append(line)
    for storage in STORAGES:
        paced = latency_case(endpoints, storage, settings)
        emit(paced, settings.as_json)
        summary[f"{storage}_p50_ms"] = paced["p50_ms"]
        summary[f"{storage}_p99_ms"] = paced["p99_ms"]
    failover = failover_case(nodes, group)
    emit(failover, settings.as_json)
    summary["produce_records_per_s"] = round(statistics.median(rates["ha"]))
    summary["raft_topic_produce_per_s"] = round(statistics.median(rates["raft"]))
    summary["ledger_topic_produce_per_s"] = round(statistics.median(rates["ledger"]))
    raft_ratios = [ha / raft for ha, raft in zip(rates["ha"], rates["raft"], strict=True)]
    ledger_ratios = [ha / other for ha, other in zip(rates["ha"], rates["ledger"], strict=True)]
    summary["ratio_ha_to_raft_produce"] = round(statistics.median(raft_ratios), 3)
    summary["ratio_ha_to_ledger_produce"] = round(statistics.median(ledger_ratios), 3)
    summary["ratio_ha_to_raft_produce_rounds"] = [round(ratio, 3) for ratio in raft_ratios]
    summary["rounds"] = settings.rounds
    summary["failover_seconds"] = failover["failover_seconds"]
    for key in ("client_cpu_us_per_record", "node_cpu_us_per_record", "client_cpu_share"):
        summary[f"ha_{key}"] = round(statistics.median(line[key] for line in ha_lines), 2)
    return summary


def run_ha_benchmark(
    as_json: bool, quick: bool, directory: str | None, rounds: int | None = None
) -> None:
    settings = Settings(quick, directory, as_json, rounds)
    base = Path(tempfile.mkdtemp(prefix="quorumlog-bench-ha-", dir=directory))
    nodes = NodeCluster(base, 3, CLUSTER_ID)
    try:
        nodes.start()
        summary = run_cases(nodes, settings)
    finally:
        nodes.stop()
        shutil.rmtree(base, ignore_errors=True)
    emit(summary, as_json)
