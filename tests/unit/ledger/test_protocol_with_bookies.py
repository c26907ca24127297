"""The protocol cores against the shipped bookie (ledger/bookie.py), not the fake one.

The same random failure schedules as test_protocol_properties.py, with every bookie a real
`Bookie` on its own storage on a simulated disk (in memory, synced by hand). The bookie
comes from another branch of issue 11: until it is there, this module skips.
"""

from __future__ import annotations

import random as random_module
from collections import deque
from collections.abc import Callable
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from quorumlog.codec.wire import ErrorCode, ErrorResponse
from quorumlog.ledger.protocol_actions import BookieAnswer, BookieRequest
from tests.unit.ledger.test_protocol_properties import SHAPES, run_random_failure_schedule

bookie_module = pytest.importorskip("quorumlog.ledger.bookie")
storage_module = pytest.importorskip("quorumlog.ledger.bookie_storage")
filesystem_module = pytest.importorskip("quorumlog.testing.sim.filesystem")

EXAMPLES = 40


class InlineBackground:
    """Runs a sync job at once (the simulated disk makes it cheap)."""

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        try:
            job()
        except Exception as error:  # handed to the bookie, which fails its waiters
            done(error)
            return
        done(None)


class RealBookie:
    """A shipped Bookie behind the world's `handle(request) -> answer`."""

    def __init__(self, bookie_id: str) -> None:
        disk = filesystem_module.SimFileSystem(random_module.Random(bookie_id))
        storage = storage_module.BookieStorage.open(Path("/") / bookie_id, file_system=disk)
        self.soon: deque[Callable[[], None]] = deque()
        self.bookie = bookie_module.Bookie(storage, InlineBackground(), self.soon.append)
        self.sick = False
        self.keeps_length = True  # what it stores is up to the bookie

    def handle(self, request: BookieRequest) -> BookieAnswer:
        if self.sick:
            return ErrorResponse(request.request_id, ErrorCode.INTERNAL, "storage failed")
        answers: list[BookieAnswer] = []
        self.bookie.handle(request, answers.append)
        while self.soon:  # the group commit's turn of the loop
            self.soon.popleft()()
        assert len(answers) == 1, answers
        return answers[0]


@given(
    shape=st.sampled_from(SHAPES),
    seed=st.integers(0, 2**32 - 1),
    steps=st.integers(50, 300),
)
def check_with_real_bookies(shape: tuple[int, int, int], seed: int, steps: int) -> None:
    run_random_failure_schedule(shape, seed, steps, RealBookie)


def test_invariants_hold_with_the_shipped_bookies() -> None:
    settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(check_with_real_bookies)()
