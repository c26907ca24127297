"""Random sequences of append / sync / truncate / reset / reopen against a list model."""

from __future__ import annotations

import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from quorumlog.storage import EntryType, LogEntry, LogStore
from tests.unit.storage.conftest import STORE_KINDS, StoreHarness


class StoreModel(RuleBasedStateMachine):
    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        self.harness = StoreHarness(self.kind, Path(self.directory.name) / "log")
        self.store: LogStore = self.harness.open()
        self.first_index = 1
        self.model: list[LogEntry] = []
        self.term = 1

    @initialize()
    def start(self) -> None:
        pass

    @property
    def last_index(self) -> int:
        return self.first_index + len(self.model) - 1

    @rule(
        count=st.integers(1, 12),
        size=st.integers(0, 300),
        kind=st.sampled_from(list(EntryType)),
        bump_term=st.booleans(),
    )
    def append(self, count: int, size: int, kind: EntryType, bump_term: bool) -> None:
        if bump_term:
            self.term += 1
        start = self.last_index + 1
        batch = [
            LogEntry(index=i, term=self.term, data=bytes([(i * 7) % 256]) * size, type=kind)
            for i in range(start, start + count)
        ]
        self.store.append(batch)
        self.model.extend(batch)

    @rule()
    def sync(self) -> None:
        self.store.sync()

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data())
    def truncate_suffix(self, data: st.DataObject) -> None:
        last_kept = data.draw(st.integers(self.first_index - 1, self.last_index))
        self.store.truncate_suffix(last_kept)
        del self.model[last_kept - self.first_index + 1 :]

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data())
    def truncate_prefix(self, data: st.DataObject) -> None:
        first_kept = data.draw(st.integers(self.first_index, self.last_index + 1))
        self.store.truncate_prefix(first_kept)
        del self.model[: first_kept - self.first_index]
        self.first_index = first_kept

    @rule(jump=st.integers(0, 50))
    def reset(self, jump: int) -> None:
        next_index = self.last_index + 1 + jump
        self.store.reset(next_index)
        self.model = []
        self.first_index = next_index

    @rule()
    def sync_and_reopen(self) -> None:
        self.store.sync()
        self.store = self.harness.reopen(self.store)

    @invariant()
    def matches_model(self) -> None:
        assert self.store.first_index == self.first_index
        assert self.store.last_index == self.last_index
        assert self.store.entries(self.first_index, self.last_index + 1) == self.model
        if self.model:
            assert self.store.term(self.last_index) == self.model[-1].term

    def teardown(self) -> None:
        self.store.close()
        self.directory.cleanup()


def make_machine(kind: str) -> type[StoreModel]:
    return type(f"StoreModel_{kind}", (StoreModel,), {"kind": kind})


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_store_matches_list_model(kind: str) -> None:
    machine = make_machine(kind)
    runner = machine.TestCase()
    runner.settings = settings(
        max_examples=60,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    runner.runTest()
