"""The verdict (checks.py) and the carrier summary (report.py), without a cluster."""

from __future__ import annotations

import dataclasses

import msgspec

from quorumlog.demo.checks import CheckInputs, run_checks
from quorumlog.demo.pipeline import FlightStats, GroupTotals
from quorumlog.demo.produce import FailoverReport, ProduceReport
from quorumlog.demo.report import summarize_carriers

UA_JANUARY = FlightStats("UA", "United Air Lines Inc.", 1, 3, 1, 10.0, 20)
UA_FEBRUARY = FlightStats("UA", "United Air Lines Inc.", 2, 1, 0, 40.0, 40)
B6_JANUARY = FlightStats("B6", "JetBlue Airways", 1, 1, 0, -5.0, -5)
RESULTS = [B6_JANUARY, UA_JANUARY, UA_FEBRUARY]
RECORDS = 5


def passing_inputs() -> CheckInputs:
    return CheckInputs(
        expected_records=RECORDS,
        produced=ProduceReport(
            sent=RECORDS,
            acknowledged=RECORDS,
            failed=0,
            distinct_positions=RECORDS,
            failover=FailoverReport(
                partition=0,
                killed_node="n1",
                killed_at_record=2,
                new_leader="n2",
                election_seconds=1.0,
                restarted=True,
                in_sync_seconds=2.0,
            ),
        ),
        stored_records=RECORDS,
        counted=GroupTotals.expected(RECORDS),
        results=RESULTS,
        kv_results={stats.key: stats for stats in RESULTS},
        topic_results={stats.key: stats for stats in RESULTS},
    )


def failed_names(inputs: CheckInputs) -> list[str]:
    return [check.name for check in run_checks(inputs) if not check.passed]


def test_expected_totals_are_those_of_ids_zero_to_n_minus_one() -> None:
    ids = range(336_776)
    assert GroupTotals.expected(len(ids)) == GroupTotals(
        flights=len(ids),
        id_sum=sum(ids),
        id_square_sum=sum(number * number for number in ids),
    )


def test_a_clean_run_passes_every_check() -> None:
    checks = run_checks(passing_inputs())
    assert len(checks) == 9
    assert failed_names(passing_inputs()) == []


def test_a_duplicate_hidden_by_a_lost_record_fails_the_checksum() -> None:
    # Ids 0..4 counted as 0, 1, 1, 3, 4: the count is right, the sums are not.
    counted = GroupTotals(flights=5, id_sum=9, id_square_sum=27)
    inputs = dataclasses.replace(passing_inputs(), counted=counted)
    assert failed_names(inputs) == ["each flight id counted once (id sum, id² sum)"]


def test_a_record_stored_twice_fails_the_stored_count() -> None:
    inputs = dataclasses.replace(passing_inputs(), stored_records=RECORDS + 1)
    assert failed_names(inputs) == ["records stored in the topic (end offsets)"]


def test_a_failed_send_fails_the_producer_checks() -> None:
    produced = dataclasses.replace(
        passing_inputs().produced, acknowledged=RECORDS - 1, failed=1, distinct_positions=4
    )
    inputs = dataclasses.replace(passing_inputs(), produced=produced)
    assert failed_names(inputs) == [
        "records acknowledged to the producer",
        "records the producer saw fail",
        "distinct (partition, offset) acknowledged",
    ]


def test_sinks_must_hold_every_group_equal_and_nothing_else() -> None:
    stale = msgspec.structs.replace(UA_FEBRUARY, flights=0)
    inputs = dataclasses.replace(
        passing_inputs(),
        kv_results={**passing_inputs().kv_results, UA_FEBRUARY.key: stale},
        topic_results={**passing_inputs().topic_results, "XX/01": B6_JANUARY},
    )
    checks = {check.name: check for check in run_checks(inputs)}
    assert checks["result groups in the KV"].actual == "2 equal"
    assert not checks["result groups in the KV"].passed
    assert checks["result groups in the output topic"].actual == "3 equal, 1 unexpected"
    assert not checks["result groups in the output topic"].passed


def test_a_node_that_never_came_back_fails_the_failover_check() -> None:
    failover = dataclasses.replace(passing_inputs().produced.failover, in_sync_seconds=None)
    produced = dataclasses.replace(passing_inputs().produced, failover=failover)
    inputs = dataclasses.replace(passing_inputs(), produced=produced)
    assert failed_names(inputs) == ["leader n1 killed half way, replaced"]


def test_carrier_summary_weights_monthly_means_by_departed_flights() -> None:
    united, jetblue = summarize_carriers(RESULTS)
    assert (united.carrier, united.flights, united.cancelled) == ("UA", 4, 1)
    # January: 2 departed at 10.0 on average; February: 1 at 40.0.
    assert united.mean_dep_delay == 20.0
    assert (united.worst_month, united.worst_p90_dep_delay) == (2, 40)
    assert (jetblue.carrier, jetblue.mean_dep_delay) == ("B6", -5.0)


def test_result_keys_sort_by_carrier_then_month() -> None:
    assert UA_JANUARY.key == "UA/01"
    assert UA_JANUARY.kv_key == "results/flights/UA/01"
    assert sorted(stats.key for stats in RESULTS) == ["B6/01", "UA/01", "UA/02"]
