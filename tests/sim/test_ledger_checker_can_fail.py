"""The ledger simulator notices broken cores: each test patches a deliberate bug into the
shipped protocol code (as TigerBeetle's tests break the code on purpose) and the seed
sweep must catch it within a few dozen seeds. A checker that never fails proves nothing.
"""

from __future__ import annotations

import pytest

from quorumlog.codec.wire import AddEntries
from quorumlog.ledger.bookie import Bookie, _Waiter
from quorumlog.ledger.protocol_actions import LedgerActions
from quorumlog.ledger.protocol_recovery import LedgerRecovery
from quorumlog.ledger.protocol_schedule import DistributionSchedule
from quorumlog.ledger.protocol_write import LedgerWriter
from quorumlog.testing.sim.ledger.runner import run_seed
from quorumlog.testing.sim.runner import silence_simulated_nodes

SEEDS_MAX = 60


def first_failures(seed_count: int = SEEDS_MAX, wanted: int = 1) -> list[str]:
    """The failure messages of the first `wanted` failing seeds among 1..seed_count."""
    silence_simulated_nodes()
    failures: list[str] = []
    for seed in range(1, seed_count + 1):
        result = run_seed(seed, capture_trace=False)
        if not result.ok:
            failures.append(f"seed {seed}: {result.failure}")
            if len(failures) >= wanted:
                break
    return failures


def test_a_writer_that_reports_an_ack_one_entry_early_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = LedgerWriter.take_actions
    reported: dict[int, int] = {}

    def one_early(self: LedgerWriter) -> LedgerActions:
        actions = original(self)
        last_add_confirmed = actions.last_add_confirmed
        if last_add_confirmed is not None and not self.recovery:
            claim = min(last_add_confirmed + 1, self.next_entry_id - 1)
            if claim <= reported.get(id(self), -1):
                actions.last_add_confirmed = None  # already claimed: keep acks in order
            else:
                actions.last_add_confirmed = reported[id(self)] = claim
        return actions

    monkeypatch.setattr(LedgerWriter, "take_actions", one_early)
    failures = first_failures(wanted=2)
    assert len(failures) == 2
    assert all("acknowledged" in failure for failure in failures), failures


def test_a_recovery_that_stops_at_the_first_not_found_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One explicit "not here" instead of Qf = Qw - Qa + 1: with Qw=3, Qa=2 an entry acked
    by two bookies is cut off by the third, which never got it."""

    def first_not_found(self: LedgerRecovery) -> bool:
        cursor = self.cursor
        if cursor <= self.known_acknowledged or cursor in self.found:
            return False
        return any(
            self.bookies[position].fenced and cursor in self.bookies[position].missing
            for position in self.schedule.write_set(cursor)
        )

    monkeypatch.setattr(LedgerRecovery, "cursor_unrecoverable", first_not_found)
    failures = first_failures()
    assert failures, f"no seed of 1..{SEEDS_MAX} noticed the broken recovery"
    assert "acknowledged through" in failures[0]


def test_a_writer_that_acks_one_bookie_short_of_the_ack_quorum_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = DistributionSchedule.acknowledged_frontier

    def one_short(
        self: DistributionSchedule, watermarks: list[int], last_add_confirmed: int
    ) -> int:
        ack_quorum_size = self.ack_quorum_size
        self.ack_quorum_size = max(1, ack_quorum_size - 1)
        try:
            return original(self, watermarks, last_add_confirmed)
        finally:
            self.ack_quorum_size = ack_quorum_size

    monkeypatch.setattr(DistributionSchedule, "acknowledged_frontier", one_short)
    failures = first_failures()
    assert failures, f"no seed of 1..{SEEDS_MAX} noticed acks short of the quorum"


def test_a_bookie_that_acks_adds_before_its_journal_sync_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Acked, then lost to a power loss before the fsync: an acknowledged entry is gone."""
    original = Bookie.after_durable

    def ack_before_sync(self: Bookie, waiter: _Waiter) -> None:
        if isinstance(waiter.request, AddEntries):
            waiter.respond(waiter.response)
            return
        original(self, waiter)

    monkeypatch.setattr(Bookie, "after_durable", ack_before_sync)
    failures = first_failures()
    assert failures, f"no seed of 1..{SEEDS_MAX} noticed adds acknowledged before the sync"
