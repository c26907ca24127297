"""Heartbeat messages of a busy group, counted in the simulator (a figure, not a test).

    python -m quorumlog.bench.heartbeat_counts [--seeds 5] [--puts 40]

One 3-node group with the node's heartbeat settings (quiet groups after 4 idle ticks,
commit-only heartbeats spaced 2 ticks) takes one put at a time, with a pause of 0, 3 or 8
ticks after each (a partition of a busy node gets a batch now and then and goes idle or
quiet in between). Every message the hosts send is counted by kind; the last line is one
JSON object with heartbeats and their answers per simulated second and per put. The
simulator is deterministic: the same tree gives the same counts on a busy machine or a
quiet one, so two trees compare exactly. To count an older tree, run this file as a
script with that tree first on PYTHONPATH (it uses only the simulator's public kit).
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Callable

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.messages import Message, Push, PushKind, PushResponse
from quorumlog.testing.sim.cluster import SimCluster, SimOptions

PAUSES_TICKS = (0, 3, 8)
NODE_LIKE_RAFT = RaftConfig(node_id="template", quiesce_idle_ticks=4, commit_heartbeat_ticks=2)


def count_sends(cluster: SimCluster, counts: collections.Counter[str]) -> None:
    """Count every message each host sends, heartbeats and their answers apart."""
    for node in cluster.nodes.values():
        original: Callable[[Message], None] = node.host.send_message

        def counting(message: Message, original: Callable[[Message], None] = original) -> None:
            kind = type(message).__name__
            if isinstance(message, Push | PushResponse) and message.kind is PushKind.COMMIT:
                kind = "heartbeat" if isinstance(message, Push) else "heartbeat_answer"
            counts[kind] += 1
            original(message)

        node.host.send_message = counting


def run_case(pause_ticks: int, seeds: int, puts: int) -> dict[str, float]:
    counts: collections.Counter[str] = collections.Counter()
    simulated_ms = 0
    for seed in range(seeds):
        cluster = SimCluster(seed, SimOptions(node_count=3, raft=NODE_LIKE_RAFT))
        cluster.wait_for_leader()
        count_sends(cluster, counts)
        started_ms = cluster.events.now_ms
        for number in range(puts):
            cluster.put(f"k{number}", "v", ticks_max=60)
            cluster.run(ticks=pause_ticks)
        simulated_ms += cluster.events.now_ms - started_ms
    seconds = simulated_ms / 1000
    total_puts = seeds * puts
    return {
        "pause_ticks": pause_ticks,
        "heartbeats": counts["heartbeat"],
        "heartbeat_answers": counts["heartbeat_answer"],
        "other_messages": sum(counts.values()) - counts["heartbeat"] - counts["heartbeat_answer"],
        "heartbeat_messages_per_simulated_second": round(
            (counts["heartbeat"] + counts["heartbeat_answer"]) / seconds, 1
        ),
        "heartbeat_messages_per_put": round(
            (counts["heartbeat"] + counts["heartbeat_answer"]) / total_puts, 2
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--puts", type=int, default=40)
    arguments = parser.parse_args()
    cases = [run_case(pause, arguments.seeds, arguments.puts) for pause in PAUSES_TICKS]
    for case in cases:
        print(json.dumps(case))
    print(
        json.dumps(
            {
                f"heartbeat_messages_per_put_pause_{c['pause_ticks']}": c[
                    "heartbeat_messages_per_put"
                ]
                for c in cases
            }
        )
    )


if __name__ == "__main__":
    main()
