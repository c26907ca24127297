"""`quorumlog bench kv`: committed puts per second on a real 3-node cluster, against PySyncObj.

Phases, each printed as one JSON object with a "phase" name:

- `disk`: fdatasync latency of the benchmark directory (4 KiB writes). It is the floor
  under every commit latency below: a put is answered after two of three nodes synced.
- `quorumlog-throughput`: 3 `quorumlog node` processes on loopback, fsync on, driven for
  `--seconds` by `--clients` load processes, each an `AsyncKVClient` with `--concurrency`
  puts in flight (100-byte values; the client batches and pipelines them). Reports
  committed puts/s, latency percentiles, and each node's CPU use per put.
- `quorumlog-paced`: one load process starting 1,000 puts/s whatever the answers do (open
  loop), against the same cluster: latency at a moderate, steady load.
- `quorumlog-nodes`: the peak RSS of each node process (VmHWM from /proc).
- `pysyncobj-throughput`: 3 PySyncObj processes on loopback (a SyncObj with a
  `@replicated` put, log in memory — its design), the same puts for the same time, driven
  from inside the leader's process (PySyncObj has no client protocol; followers would only
  forward to it).

With `--tls`, `quorumlog-tls-throughput` follows `quorumlog-nodes`: throughput rounds
on a fresh plaintext cluster and a fresh cluster that requires TLS of peers and clients,
alternated (bench/kv_tls.py); the share compares those rounds.

The last line sums it up: ops_per_s, p50_ms, p99_ms, pysyncobj_ops_per_s,
ratio_to_pysyncobj, p99_ms_at_1000_ops, node_rss_mb_max (with `--tls` also
tls_ops_per_s and tls_share_of_plaintext, which the issue wants at 0.7 or more).

A put counts when it is answered inside the measured window; load processes warm up
(connect, find the leader) before it. Latencies come from log-scale histograms (0.5 %
buckets) merged across processes. The machine's other load shows up in the figures: the
`quorumlog-throughput` line carries the load average at its start.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from quorumlog.bench.kv_load import LatencyHistogram, LoadResult
from quorumlog.bench.kv_processes import (
    NodeCluster,
    cpu_seconds,
    free_ports,
    last_json_line,
    peak_rss_megabytes,
    run_load_processes,
)
from quorumlog.bench.kv_tls import ROUND_ORDER, TLSNodeCluster, tls_summary

CLUSTER_ID = "bench-kv"
WARM_UP_SECONDS_MAX = 1.0
"""Between the start signal and the window: the load runs, pipelines fill, nothing counts
(half the window when that is shorter, so a smoke run stays short)."""
VALUE_BYTES = 100
PACED_RATE_OPS_PER_SECOND = 1000.0
PACED_SECONDS_MAX = 5.0
DISK_SYNCS = 50


class KVBenchSettings:
    def __init__(
        self,
        seconds: float = 8.0,
        clients: int = 2,
        concurrency: int = 2000,
        pysyncobj_concurrency: int | None = None,
        paced_seconds: float | None = None,
        directory: str | None = None,
        tls: bool = False,
    ) -> None:
        self.seconds = seconds
        self.clients = clients
        self.concurrency = concurrency
        """Puts in flight per load process."""
        self.pysyncobj_concurrency = (
            clients * concurrency if pysyncobj_concurrency is None else pysyncobj_concurrency
        )
        """Puts PySyncObj's leader keeps in flight; by default as many as all quorumlog
        load processes together, so both systems see the same offered load."""
        self.paced_seconds = (
            min(PACED_SECONDS_MAX, seconds) if paced_seconds is None else paced_seconds
        )
        self.directory = directory
        self.warm_up_seconds = min(WARM_UP_SECONDS_MAX, seconds / 2)
        self.tls = tls
        """Also run the throughput phase on a cluster that requires TLS."""


def run_kv_benchmark(settings: KVBenchSettings, as_json: bool) -> dict[str, Any]:
    """Run every phase, printing each; returns (and prints last) the summary."""
    base = Path(tempfile.mkdtemp(prefix="quorumlog-bench-kv-", dir=settings.directory))
    try:
        emit(disk_phase(base), as_json)
        throughput, paced, nodes = quorumlog_phases(base / "quorumlog", settings, as_json)
        tls_throughput = (
            quorumlog_tls_phase(base / "quorumlog-tls", settings, as_json) if settings.tls else None
        )
        pysyncobj = pysyncobj_phase(settings)
        emit(pysyncobj, as_json)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ops_per_s = throughput["ops_per_s"]
    pysyncobj_ops_per_s = pysyncobj["ops_per_s"]
    summary = {
        "ops_per_s": ops_per_s,
        "p50_ms": throughput["p50_ms"],
        "p99_ms": throughput["p99_ms"],
        "pysyncobj_ops_per_s": pysyncobj_ops_per_s,
        "ratio_to_pysyncobj": (
            round(ops_per_s / pysyncobj_ops_per_s, 2) if pysyncobj_ops_per_s else None
        ),
        "p99_ms_at_1000_ops": paced["p99_ms"],
        "node_rss_mb_max": nodes["node_rss_mb_max"],
    }
    if tls_throughput is not None:
        summary.update(
            tls_summary(tls_throughput["plaintext_ops_per_s"], tls_throughput["tls_ops_per_s"])
        )
    emit(summary, as_json)
    return summary


def emit(figures: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(figures), flush=True)
    else:
        print("  ".join(f"{key}={value}" for key, value in figures.items()), flush=True)


# --- phases ------------------------------------------------------------------------------


def disk_phase(directory: Path) -> dict[str, Any]:
    path = directory / "fsync-probe"
    latencies: list[float] = []
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        block = b"\0" * 4096
        for _ in range(DISK_SYNCS):
            os.write(descriptor, block)
            started = time.perf_counter()
            os.fdatasync(descriptor)
            latencies.append(time.perf_counter() - started)
    finally:
        os.close(descriptor)
        path.unlink()
    latencies.sort()
    return {
        "phase": "disk",
        "fdatasync_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "fdatasync_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 3),
    }


def quorumlog_phases(
    directory: Path, settings: KVBenchSettings, as_json: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    directory.mkdir(parents=True)
    cluster = NodeCluster(directory, node_count=3, cluster_id=CLUSTER_ID)
    try:
        leader = cluster.start()
        throughput = quorumlog_throughput(cluster, leader, settings)
        emit(throughput, as_json)
        paced = quorumlog_paced(cluster, settings)
        emit(paced, as_json)
        rss = {node_id: round(peak_rss_megabytes(pid), 1) for node_id, pid in cluster.pids.items()}
        nodes = {"phase": "quorumlog-nodes", "rss_mb": rss, "node_rss_mb_max": max(rss.values())}
        emit(nodes, as_json)
    finally:
        cluster.stop()
    return throughput, paced, nodes


def quorumlog_tls_phase(
    directory: Path, settings: KVBenchSettings, as_json: bool
) -> dict[str, Any]:
    """Throughput rounds on a plaintext and a TLS cluster, both up, in the order of
    `ROUND_ORDER` (see bench/kv_tls.py): the share TLS keeps, measured under the same
    drift of the machine's other load."""
    directory.mkdir(parents=True)
    plaintext = NodeCluster(directory / "plaintext", node_count=3, cluster_id=CLUSTER_ID)
    secured = TLSNodeCluster(directory / "tls", node_count=3, cluster_id=CLUSTER_ID)
    (directory / "plaintext").mkdir()
    rounds: dict[str, list[float]] = {"plaintext": [], "tls": []}
    cpu_rounds: dict[str, list[float]] = {"plaintext": [], "tls": []}
    try:
        leaders = {"plaintext": plaintext.start(), "tls": secured.start()}
        for name in ROUND_ORDER:
            cluster = secured if name == "tls" else plaintext
            load_arguments = secured.load_arguments() if name == "tls" else None
            figures = quorumlog_throughput(cluster, leaders[name], settings, load_arguments)
            rounds[name].append(figures["ops_per_s"])
            cpu_rounds[name].append(figures["cpu_us_per_op_total"])
    finally:
        secured.stop()
        plaintext.stop()
    throughput = {
        "phase": "quorumlog-tls-throughput",
        "round_order": list(ROUND_ORDER),
        "plaintext_rounds_ops_per_s": rounds["plaintext"],
        "tls_rounds_ops_per_s": rounds["tls"],
        "plaintext_ops_per_s": round(statistics.mean(rounds["plaintext"]), 1),
        "tls_ops_per_s": round(statistics.mean(rounds["tls"]), 1),
        # CPU per put (nodes and load processes) drifts less with the machine's other
        # load than puts/s does: what TLS costs, as a second view.
        "plaintext_cpu_us_per_op": round(statistics.mean(cpu_rounds["plaintext"]), 2),
        "tls_cpu_us_per_op": round(statistics.mean(cpu_rounds["tls"]), 2),
    }
    emit(throughput, as_json)
    return throughput


def load_command(
    endpoints: list[str],
    seconds: float,
    client_number: int,
    extra_arguments: tuple[str, ...] = (),
    **options: float,
) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "quorumlog.bench.kv_load",
        "--endpoints",
        ",".join(endpoints),
        "--cluster-id",
        CLUSTER_ID,
        "--seconds",
        repr(seconds),
        "--client-number",
        str(client_number),
        "--value-bytes",
        str(VALUE_BYTES),
    ]
    for name, value in options.items():
        command += [f"--{name.replace('_', '-')}", repr(value)]
    return [*command, *extra_arguments]


def quorumlog_throughput(
    cluster: NodeCluster,
    leader: str,
    settings: KVBenchSettings,
    load_arguments: list[str] | None = None,
) -> dict[str, Any]:
    commands = [
        load_command(
            cluster.endpoints,
            settings.seconds,
            number,
            tuple(load_arguments or ()),
            concurrency=settings.concurrency,
        )
        for number in range(settings.clients)
    ]
    load_average = os.getloadavg()[0]
    cpu = CpuMeter(settings.seconds, cluster.pids, "client")
    _, outputs = run_load_processes(commands, settings.seconds, settings.warm_up_seconds, cpu.start)
    results = [last_json_line(output, LoadResult) for output in outputs]
    figures = load_figures(results, settings.seconds)
    used = cpu.used()
    return {
        "phase": "quorumlog-throughput",
        "fsync": True,
        "clients": settings.clients,
        "concurrency_per_client": settings.concurrency,
        "value_bytes": VALUE_BYTES,
        "leader": leader,
        **figures,
        **cpu_figures(used, figures["ops"]),
        "load_average_at_start": round(load_average, 2),
    }


def quorumlog_paced(cluster: NodeCluster, settings: KVBenchSettings) -> dict[str, Any]:
    command = load_command(
        cluster.endpoints, settings.paced_seconds, 99, rate=PACED_RATE_OPS_PER_SECOND
    )
    _, [output] = run_load_processes([command], settings.paced_seconds, settings.warm_up_seconds)
    result = last_json_line(output, LoadResult)
    figures = load_figures([result], settings.paced_seconds)
    return {
        "phase": "quorumlog-paced",
        "target_ops_per_s": PACED_RATE_OPS_PER_SECOND,
        "started": getattr(result, "started", 0),
        **figures,
    }


def pysyncobj_phase(settings: KVBenchSettings) -> dict[str, Any]:
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    commands = [
        [
            sys.executable,
            "-m",
            "quorumlog.bench.kv_pysyncobj",
            "--self",
            address,
            "--partners",
            ",".join(other for other in addresses if other != address),
            "--seconds",
            repr(settings.seconds),
            "--concurrency",
            str(settings.pysyncobj_concurrency),
            "--value-bytes",
            str(VALUE_BYTES),
            "--leader-only",
        ]
        for address in addresses
    ]
    load_average = os.getloadavg()[0]
    cpu = CpuMeter(settings.seconds, {}, "peer")
    _, outputs = run_load_processes(commands, settings.seconds, settings.warm_up_seconds, cpu.start)
    results = [last_json_line(output, LoadResult) for output in outputs]
    figures = load_figures(results, settings.seconds)
    return {
        "phase": "pysyncobj-throughput",
        "log": "memory",
        "concurrency": settings.pysyncobj_concurrency,
        "value_bytes": VALUE_BYTES,
        **figures,
        **cpu_figures(cpu.used(), figures["ops"]),
        "load_average_at_start": round(load_average, 2),
    }


# --- figures -----------------------------------------------------------------------------


def load_figures(results: list[Any], seconds: float) -> dict[str, Any]:
    histogram = LatencyHistogram()
    ops = errors = 0
    for result in results:
        ops += result.ops
        errors += result.errors
        histogram.merge(LatencyHistogram({int(k): v for k, v in result.histogram.items()}))
    return {
        "ops": ops,
        "errors": errors,
        "ops_per_s": round(ops / seconds, 1),
        "p50_ms": histogram.percentile_ms(0.50),
        "p99_ms": histogram.percentile_ms(0.99),
        "p999_ms": histogram.percentile_ms(0.999),
    }


def cpu_figures(used: dict[str, float], ops: int) -> dict[str, Any]:
    """CPU time per put, per process and in all, and the puts/s that much CPU per put
    would allow if the benchmark had every core of this machine to itself."""
    total_seconds = sum(used.values())
    cores = os.cpu_count() or 1
    return {
        "cpu_us_per_op": {
            name: round(seconds * 1e6 / max(ops, 1), 2) for name, seconds in used.items()
        },
        "cpu_us_per_op_total": round(total_seconds * 1e6 / max(ops, 1), 2),
        "ops_per_s_if_cpu_bound_on_idle_cores": (
            round(ops * cores / total_seconds) if total_seconds else None
        ),
    }


class CpuMeter:
    """CPU seconds each process uses in the window, read from /proc at its two ends.

    `start(start_at, load_pids)` (the `on_start` of `run_load_processes`) adds the load
    processes to the processes given here and arms a timer thread that samples at start_at
    and at start_at + seconds, so the load runs undisturbed."""

    def __init__(self, seconds: float, pids: dict[str, int], load_name: str) -> None:
        self.seconds = seconds
        self.pids = dict(pids)
        self.load_name = load_name
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.thread: threading.Thread | None = None

    def start(self, start_at: float, load_pids: list[int]) -> None:
        for number, pid in enumerate(load_pids):
            self.pids[f"{self.load_name}-{number}"] = pid
        self.thread = threading.Thread(target=self.run, args=(start_at,), daemon=True)
        self.thread.start()

    def run(self, start_at: float) -> None:
        time.sleep(max(start_at - time.monotonic(), 0))  # a timer, not a wait for a condition
        self.before = self.sample()
        time.sleep(max(start_at + self.seconds - time.monotonic(), 0))
        self.after = self.sample()

    def sample(self) -> dict[str, float]:
        samples = {}
        for name, pid in self.pids.items():
            try:
                samples[name] = cpu_seconds(pid)
            except OSError:
                continue
        return samples

    def used(self) -> dict[str, float]:
        if self.thread is not None:
            self.thread.join()
        return {
            name: self.after[name] - self.before[name] for name in self.before if name in self.after
        }
