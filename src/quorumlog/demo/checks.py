"""The demo's verdict: every figure the run can measure, compared with what it must be.

    acknowledged   the producer's futures: all N succeeded, none failed
    distinct       the N acknowledgements name N distinct (partition, offset) places
    stored         the topic's end offsets, summed over partitions: N (nothing written twice)
    counted        flights Spark aggregated, summed over groups: N
    exactly once   Spark's id checksums equal those of ids 0..N-1 (see pipeline.py)
    KV             every result group read back from the KV equals Spark's
    output topic   the newest record per group in the output topic equals Spark's
    failover       the killed leader was replaced (and the node came back, when restarted)

Pure functions of what the stages measured, so they are tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.demo.pipeline import FlightStats, GroupTotals
from quorumlog.demo.produce import FailoverReport, ProduceReport


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    actual: str
    passed: bool


@dataclass(frozen=True)
class CheckInputs:
    expected_records: int
    produced: ProduceReport
    stored_records: int
    """Sum over the topic's partitions of (end offset - begin offset)."""
    counted: GroupTotals
    results: list[FlightStats]
    kv_results: dict[str, FlightStats]
    """Result key → what the KV holds under its key (every key under the results prefix)."""
    topic_results: dict[str, FlightStats]
    """Result key → the newest record of that key in the output topic."""


def count_check(name: str, expected: int, actual: int) -> Check:
    return Check(name, f"{expected:,}", f"{actual:,}", expected == actual)


def run_checks(inputs: CheckInputs) -> list[Check]:
    expected = inputs.expected_records
    produced = inputs.produced
    checks = [
        count_check("records acknowledged to the producer", expected, produced.acknowledged),
        count_check("records the producer saw fail", 0, produced.failed),
        count_check(
            "distinct (partition, offset) acknowledged", expected, produced.distinct_positions
        ),
        count_check("records stored in the topic (end offsets)", expected, inputs.stored_records),
        count_check("records counted by Spark", expected, inputs.counted.flights),
        checksum_check(inputs.counted, GroupTotals.expected(expected)),
        sink_check("result groups in the KV", inputs.results, inputs.kv_results),
        sink_check("result groups in the output topic", inputs.results, inputs.topic_results),
    ]
    if produced.failover is not None:
        checks.append(failover_check(produced.failover))
    return checks


def checksum_check(counted: GroupTotals, expected: GroupTotals) -> Check:
    return Check(
        "each flight id counted once (id sum, id² sum)",
        f"{expected.id_sum:,}, {expected.id_square_sum:,}",
        f"{counted.id_sum:,}, {counted.id_square_sum:,}",
        (counted.id_sum, counted.id_square_sum) == (expected.id_sum, expected.id_square_sum),
    )


def sink_check(name: str, results: list[FlightStats], stored: dict[str, FlightStats]) -> Check:
    """All of Spark's groups, equal, and nothing else under the result keys."""
    matching = sum(1 for stats in results if stored.get(stats.key) == stats)
    extra = len(set(stored) - {stats.key for stats in results})
    actual = f"{matching:,} equal"
    if extra:
        actual += f", {extra:,} unexpected"
    return Check(name, f"{len(results):,} equal", actual, matching == len(results) and not extra)


def failover_check(failover: FailoverReport) -> Check:
    expected = "new leader" + (", node back in sync" if failover.restarted else "")
    if failover.killed_node is None:
        return Check("leader killed half way, replaced", expected, "no kill", False)
    actual = "new leader" if failover.new_leader is not None else "no new leader"
    passed = failover.new_leader is not None
    if failover.restarted:
        in_sync = failover.in_sync_seconds is not None
        actual += ", node back in sync" if in_sync else ", node not back in sync"
        passed = passed and in_sync
    return Check(
        f"leader {failover.killed_node} killed half way, replaced", expected, actual, passed
    )
