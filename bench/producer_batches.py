"""The producer client's CPU per batch and per record, against an in-process fake cluster.

No fsync and no Raft: the test suite's fake stream cluster (three nodes on one event loop,
speaking the real wire protocol) runs in its own process and answers every produce at
once, so the client process's CPU is the producer's own. One client run sends `--records`
records of 100 bytes round robin over a fresh topic of P partitions and reports its
process CPU, its I/O thread's CPU ("quorumlog-producer"), the batches sent and both per
batch and per record.

Old against new (runs alternate, as `quorumlog.bench.tree_ab` does), from the worktree root:

    PYTHONPATH=src:. python bench/producer_batches.py ab --old OLD/src --new src --pairs 3

`--profile FILE` on a `client` run writes a cProfile of the I/O thread (its CPU clock).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BATCH_RECORDS_MAX_DEFAULT = 16_384
"""The producer's own default."""
BATCHES_HELP = (
    "a small bound (20, say) makes the batch count the same in every run, as the machine's"
    " load otherwise sways it, so the CPU per batch of two trees compares like with like"
)
VALUE_BYTES = 100
BUFFER_BYTES_MAX = 8 * 1024 * 1024
"""Under the bytes a run sends (200,000 records take about 23 MB), so the sending thread
also blocks for room, as it does in a run of a million records with the default buffer."""


def serve() -> None:
    """Run the fake cluster until standard input closes; print its endpoints first."""
    from tests.unit.kv.fake_cluster import ClusterThread
    from tests.unit.stream.fake_stream_cluster import FakeStreamCluster, FakeStreamNode

    from quorumlog.codec import wire

    class Forgetful(list[Any]):
        def append(self, item: Any) -> None:
            pass  # the fake keeps every request for tests; a bench run would fill memory

    ends: dict[tuple[str, int], int] = {}

    def produce(self: FakeStreamNode, frame: wire.Produce, reply: Any) -> None:
        # Every produce lands (no sequence check, nothing kept): the fake must keep ahead
        # of the client, or the batches would be as small as a slow node makes them.
        key = (frame.topic, frame.partition)
        base_offset = ends.get(key, 0)
        ends[key] = base_offset + len(frame.records)
        reply(wire.ProduceResult(frame.request_id, base_offset, len(frame.records), False, 1))

    FakeStreamNode.produce = produce  # type: ignore[method-assign]
    with ClusterThread(FakeStreamCluster()) as cluster:
        for node in cluster.nodes.values():
            node.requests = Forgetful()
        print(json.dumps({"endpoints": cluster.endpoints}), flush=True)
        sys.stdin.read()


def thread_cpu_seconds(thread: threading.Thread) -> float:
    if thread.ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class GarbageCollections:
    """CPU spent in the garbage collector (by every thread), and its full collections."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.started = 0.0

    def observe(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.started = time.thread_time()  # the collecting thread's CPU
            return
        self.seconds += time.thread_time() - self.started
        self.full += info["generation"] == 2


def context_switches(thread: threading.Thread) -> int:
    """The thread's voluntary context switches so far (each a wait: for the GIL, a lock,
    a condition or the event loop's poll), from Linux's /proc."""
    path = Path(f"/proc/self/task/{thread.native_id}/status")
    for line in path.read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def thread_cpu_clock() -> int:
    return time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID)


def run_in_thread(producer: Any, callback: Any) -> None:
    """Run `callback` on the producer's I/O thread and wait for it."""
    done = threading.Event()

    def call() -> None:
        callback()
        done.set()

    producer.io.call_soon(call)
    done.wait(10)


def client(
    endpoints: list[str],
    partitions: int,
    records: int,
    buffer_bytes_max: int,
    batch_records_max: int,
    profile: str | None,
) -> None:
    from quorumlog import Admin, Producer

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    with Admin(endpoints) as admin:
        admin.create_topic(topic, partitions=partitions)
    producer = Producer(
        endpoints, buffer_bytes_max=buffer_bytes_max, batch_records_max=batch_records_max
    )
    io_thread = producer.io.thread
    value = b"x" * VALUE_BYTES
    producer.send(topic, value, partition=0).result(timeout=30)  # connections, metadata
    # The thread's own CPU clock: wall time would charge a function for the GIL held by the
    # sending thread meanwhile.
    profiler = cProfile.Profile(thread_cpu_clock, 1e-9) if profile else None
    if profiler is not None:
        run_in_thread(producer, profiler.enable)
    collections = GarbageCollections()
    gc.callbacks.append(collections.observe)
    batches_before = producer.batches_sent
    process_before = time.process_time()
    thread_before = thread_cpu_seconds(io_thread)
    main_before = time.thread_time()
    main_thread = threading.current_thread()
    switches_before = context_switches(io_thread) + context_switches(main_thread)
    started = time.perf_counter()
    futures = [producer.send(topic, value, partition=n % partitions) for n in range(records)]
    producer.flush()
    elapsed_seconds = time.perf_counter() - started
    thread_seconds = thread_cpu_seconds(io_thread) - thread_before
    main_seconds = time.thread_time() - main_before
    switches = context_switches(io_thread) + context_switches(main_thread) - switches_before
    process_seconds = time.process_time() - process_before
    batches = producer.batches_sent - batches_before
    gc.callbacks.remove(collections.observe)
    if profiler is not None:
        run_in_thread(producer, profiler.disable)
        profiler.dump_stats(profile)  # type: ignore[arg-type]
    failed = sum(1 for future in futures if future.exception() is not None)
    producer.close()
    print(
        json.dumps(
            {
                "partitions": partitions,
                "records": records,
                "failed": failed,
                "batches": batches,
                "records_per_second": round(records / elapsed_seconds),
                "process_cpu_seconds": round(process_seconds, 3),
                "io_thread_cpu_seconds": round(thread_seconds, 3),
                "io_thread_us_per_batch": round(thread_seconds / batches * 1e6, 1),
                "process_us_per_batch": round(process_seconds / batches * 1e6, 1),
                "process_us_per_record": round(process_seconds / records * 1e6, 2),
                "sending_thread_us_per_record": round(main_seconds / records * 1e6, 2),
                "thread_waits_per_batch": round(switches / batches, 2),
                "gc_seconds": round(collections.seconds, 3),
                "gc_full_collections": collections.full,
            }
        ),
        flush=True,
    )


def alternate(options: argparse.Namespace) -> None:
    server = subprocess.Popen(
        [sys.executable, __file__, "serve"],
        env=dict(os.environ, PYTHONPATH=f"{options.new}:{ROOT}"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        endpoints = json.loads(server.stdout.readline())["endpoints"]
        results: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for pair in range(options.pairs):
            trees = [("old", options.old), ("new", options.new)]
            if pair % 2:
                trees.reverse()
            for partitions in [int(p) for p in options.partitions.split(",")]:
                for name, source in trees:
                    completed = subprocess.run(
                        [
                            *(sys.executable, __file__, "client"),
                            *("--endpoints", ",".join(endpoints)),
                            *("--partitions", str(partitions), "--records", str(options.records)),
                            *("--buffer-bytes-max", str(options.buffer_bytes_max)),
                            *("--batch-records-max", str(options.batch_records_max)),
                        ],
                        env=dict(os.environ, PYTHONPATH=f"{source}:{ROOT}"),
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    figures = json.loads(completed.stdout.strip().splitlines()[-1])
                    figures |= {"tree": name, "pair": pair + 1, "load": os.getloadavg()[0]}
                    print(json.dumps(figures), flush=True)
                    results.setdefault((name, partitions), []).append(figures)
        for (name, partitions), runs in sorted(results.items()):
            summary = {
                key: statistics.median(run[key] for run in runs)
                for key in (
                    "io_thread_us_per_batch",
                    "process_us_per_batch",
                    "process_us_per_record",
                    "records_per_second",
                    "batches",
                )
            }
            print(json.dumps({"case": f"{name}-{partitions}", "median": summary}), flush=True)
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve")
    client_parser = commands.add_parser("client")
    client_parser.add_argument("--endpoints", required=True)
    client_parser.add_argument("--partitions", type=int, default=1000)
    client_parser.add_argument("--records", type=int, default=200_000)
    client_parser.add_argument("--profile")
    client_parser.add_argument("--buffer-bytes-max", type=int, default=BUFFER_BYTES_MAX)
    client_parser.add_argument(
        "--batch-records-max", type=int, default=BATCH_RECORDS_MAX_DEFAULT, help=BATCHES_HELP
    )
    ab_parser = commands.add_parser("ab")
    ab_parser.add_argument("--old", type=Path, required=True)
    ab_parser.add_argument("--new", type=Path, required=True)
    ab_parser.add_argument("--pairs", type=int, default=3)
    ab_parser.add_argument("--records", type=int, default=200_000)
    ab_parser.add_argument("--partitions", default="3,1000")
    ab_parser.add_argument("--buffer-bytes-max", type=int, default=BUFFER_BYTES_MAX)
    ab_parser.add_argument(
        "--batch-records-max", type=int, default=BATCH_RECORDS_MAX_DEFAULT, help=BATCHES_HELP
    )
    options = parser.parse_args()
    if options.command == "serve":
        serve()
    elif options.command == "client":
        client(
            options.endpoints.split(","),
            options.partitions,
            options.records,
            options.buffer_bytes_max,
            options.batch_records_max,
            options.profile,
        )
    else:
        alternate(options)


if __name__ == "__main__":
    main()
