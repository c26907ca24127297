"""`KVManagedLedgerStore` over a KV stand-in: the record's compare-and-set refuses a stale
version, an unknown outcome is settled by reading the key back, and a deleted ledger is
dropped on every bookie that held it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import pytest

from quorumlog.errors import (
    ManagedLedgerConflictError,
    QuorumLogError,
    UnknownOutcomeError,
)
from quorumlog.ledger.managed_format import ManagedLedgerRecord
from quorumlog.ledger.managed_kv import KVManagedLedgerStore, compare_and_set
from quorumlog.ledger.metadata import new_ledger_metadata
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.runtime.completion import Completion
from quorumlog.testing.manual import ManualScheduler

ResultType = TypeVar("ResultType")
NAME = "events@1/0"


class DictKV:
    """The KV calls the store makes, on a dict; `unknown_after_cas` makes the next CAS
    raise UnknownOutcomeError after (True) or before (False) it takes effect."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.unknown_after_cas: bool | None = None

    def get(self, key: str, stale: bool = False) -> str | None:
        return self.data.get(key)

    def cas(self, key: str, expected: str | None, new: str | None) -> bool:
        lost = self.unknown_after_cas
        self.unknown_after_cas = None
        if lost is False:
            raise UnknownOutcomeError("timed out before the write")
        if self.data.get(key) != expected:
            return False
        if new is None:
            self.data.pop(key, None)
        else:
            self.data[key] = new
        if lost is True:
            raise UnknownOutcomeError("timed out after the write")
        return True

    def scan_prefix(
        self, prefix: str, stale: bool = False, page_keys: int = 1000
    ) -> list[tuple[str, str]]:
        return sorted((key, value) for key, value in self.data.items() if key.startswith(prefix))


class InlineCalls:
    """`BlockingCalls` run at once; the outcome settles on a later scheduler turn."""

    def __init__(self, scheduler: ManualScheduler) -> None:
        self.scheduler = scheduler

    def run(self, job: Callable[[], ResultType], completion: Completion[ResultType]) -> None:
        try:
            value = job()
        except QuorumLogError as error:
            self.scheduler.call_soon(functools.partial(completion.set_exception, error))
            return
        self.scheduler.call_soon(lambda: completion.set_result(value))


class World:
    def __init__(self) -> None:
        self.scheduler = ManualScheduler()
        self.kv = DictKV()
        self.drops: list[tuple[str, int]] = []
        self.store = KVManagedLedgerStore(
            self.scheduler,
            self.kv,
            KVMetadataStore(self.kv),
            InlineCalls(self.scheduler),
            lambda bookie, ledger: self.drops.append((bookie, ledger)),
        )

    def wait(self, completion: Completion[ResultType]) -> ResultType:
        self.scheduler.run_until_idle()
        assert completion.done()
        return completion.result()


def test_a_record_change_is_stored_only_over_the_version_it_read() -> None:
    world = World()
    first = ManagedLedgerRecord(name=NAME, owner="n1", owner_epoch=1)
    assert world.wait(world.store.write_record(first, None)) == first
    with pytest.raises(ManagedLedgerConflictError):
        world.wait(world.store.write_record(first, None))
    second = first.updated(owner="n2", owner_epoch=2)
    world.wait(world.store.write_record(second, 0))
    with pytest.raises(ManagedLedgerConflictError):
        world.wait(world.store.write_record(second.updated(), 0))
    assert world.wait(world.store.read_record(NAME)) == second
    assert world.wait(world.store.read_record("other/0")) is None


def test_an_unknown_outcome_is_settled_by_reading_the_record_back() -> None:
    world = World()
    record = ManagedLedgerRecord(name=NAME, owner="n1", owner_epoch=1)
    world.kv.unknown_after_cas = True
    assert world.wait(world.store.write_record(record, None)) == record
    # Timed out before the write: the read back finds the old record, which proves nothing
    # (the write may still apply), so the same compare-and-set goes again and settles it.
    world.kv.unknown_after_cas = False
    updated = record.updated()
    assert world.wait(world.store.write_record(updated, 0)) == updated
    assert world.wait(world.store.read_record(NAME)) == updated


def test_a_write_that_applies_after_the_read_back_still_counts_as_ours() -> None:
    """The first compare-and-set times out, the read back finds the old value, then the
    first write applies late: the resent one fails its compare, and the record is ours."""
    kv = LateKV()
    kv.data["key"] = "old"
    assert compare_and_set(kv, "key", "old", "new")
    assert kv.data["key"] == "new"


def test_an_outcome_never_settled_is_reported_unknown_not_refused() -> None:
    kv = DictKV()
    kv.data["key"] = "old"
    kv.cas = lambda key, expected, new: raise_unknown()  # type: ignore[method-assign]
    with pytest.raises(UnknownOutcomeError):
        compare_and_set(kv, "key", "old", "new")


def raise_unknown() -> bool:
    raise UnknownOutcomeError("no answer")


class LateKV(DictKV):
    """Its first compare-and-set times out and applies only after the next read."""

    def __init__(self) -> None:
        super().__init__()
        self.late: tuple[str, str | None] | None = None

    def get(self, key: str, stale: bool = False) -> str | None:
        found = super().get(key)
        if self.late is not None:
            late_key, late_value = self.late
            self.late = None
            if late_value is not None:
                self.data[late_key] = late_value
        return found

    def cas(self, key: str, expected: str | None, new: str | None) -> bool:
        if self.late is None and not hasattr(self, "sent"):
            self.sent = True
            self.late = (key, new)
            raise UnknownOutcomeError("timed out; still in the log")
        return super().cas(key, expected, new)


def test_deleting_a_ledger_drops_it_on_its_bookies_and_a_missing_one_counts_as_deleted() -> None:
    world = World()
    metadata = new_ledger_metadata(
        ensemble=["b1", "b2", "b3"], write_quorum_size=2, ack_quorum_size=2, password=b""
    )
    created = world.wait(world.store.create_ledger(metadata))
    assert world.wait(world.store.read_ledger(created.ledger_id)).ensembles == {
        0: ["b1", "b2", "b3"]
    }
    world.wait(world.store.delete_ledger(created.ledger_id))
    assert world.drops == [
        ("b1", created.ledger_id),
        ("b2", created.ledger_id),
        ("b3", created.ledger_id),
    ]
    world.wait(world.store.delete_ledger(created.ledger_id))
    assert len(world.drops) == 3
