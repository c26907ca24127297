"""The bookie garbage collector's decision (ledger/bookie_garbage.py): a local ledger is
dropped only if its id is below the allocated-id watermark read at the start of the scan,
it is absent from the metadata listing, and still absent when read again on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import cast

from quorumlog.codec import wire
from quorumlog.kv.client import KVClient
from quorumlog.ledger.bookie_garbage import BookieGarbageCollector, ledgers_to_collect
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.ledger.registry import NEXT_LEDGER_ID_KEY, ledger_key
from tests.unit.ledger.test_managed_kv import DictKV


class FakeMetadata:
    """Ledger metadata present for `present`; `created_before_verify` appear between the
    listing and the second read (a creator that was slow to write its metadata)."""

    def __init__(
        self, watermark: int, present: set[int], created_before_verify: Iterable[int] = ()
    ) -> None:
        self.watermark = watermark
        self.present = set(present)
        self.created_before_verify = set(created_before_verify)
        self.calls: list[str] = []

    def allocated_id_watermark(self) -> int:
        self.calls.append("watermark")
        return self.watermark

    def list_ledgers(self) -> list[int]:
        self.calls.append("list")
        listed = sorted(self.present)
        self.present |= self.created_before_verify
        return listed

    def ledger_exists(self, ledger_id: int) -> bool:
        self.calls.append(f"exists {ledger_id}")
        return ledger_id in self.present


def test_a_ledger_whose_metadata_was_deleted_is_collected_and_the_others_are_kept() -> None:
    metadata = FakeMetadata(watermark=10, present={1, 3})
    assert ledgers_to_collect([1, 2, 3, 4], metadata) == [2, 4]


def test_an_id_at_or_above_the_watermark_is_kept_though_its_metadata_is_absent() -> None:
    # Handed out after the scan began: its metadata may be about to be created.
    metadata = FakeMetadata(watermark=5, present=set())
    assert ledgers_to_collect([4, 5, 6], metadata) == [4]


def test_a_ledger_created_after_the_listing_survives_the_second_read() -> None:
    metadata = FakeMetadata(watermark=10, present={1}, created_before_verify={2})
    assert ledgers_to_collect([1, 2, 3], metadata) == [3]


def test_the_watermark_is_read_before_the_listing_and_only_candidates_are_read_again() -> None:
    metadata = FakeMetadata(watermark=10, present={1})
    ledgers_to_collect([1, 2], metadata)
    assert metadata.calls == ["watermark", "list", "exists 2"]


def test_the_kv_store_reads_the_counter_as_the_watermark() -> None:
    kv = DictKV()
    store = KVMetadataStore(kv)
    assert store.allocated_id_watermark() == 0
    kv.data[NEXT_LEDGER_ID_KEY] = "7"
    kv.data[ledger_key(3)] = "metadata"
    assert store.allocated_id_watermark() == 7
    assert store.ledger_exists(3)
    assert not store.ledger_exists(4)


class FakeBookie:
    """A bookie's ledger list; the drops asked of it, answered at once."""

    bookie_id = "b1"

    def __init__(self, ledger_ids: list[int]) -> None:
        self.ledgers = list(ledger_ids)
        self.drops: list[int] = []

    def ledger_ids(self) -> list[int]:
        return list(self.ledgers)

    def handle(self, request: object, reply: Callable[[object], None]) -> None:
        assert isinstance(request, wire.DropLedger)
        self.drops.append(request.ledger_id)
        reply(wire.Done(request.request_id))


class CollectorOnDict(BookieGarbageCollector):
    """The shipped collector with its KV client replaced by an in-memory KV."""

    def __init__(self, bookie: FakeBookie, kv: DictKV, collected: list[int]) -> None:
        super().__init__(
            bookie, lambda: ["127.0.0.1:1"], "quorumlog", on_collected=collected.append
        )
        self.kv = kv

    def metadata_kv(self, endpoints: list[str]) -> KVClient:
        return cast(KVClient, self.kv)


def test_a_scan_drops_the_collected_ledgers_through_the_bookie_and_counts_them() -> None:
    kv = DictKV()
    kv.data[NEXT_LEDGER_ID_KEY] = "5"
    kv.data[ledger_key(1)] = "metadata"
    bookie = FakeBookie([1, 2, 5])
    collected: list[int] = []
    collector = CollectorOnDict(bookie, kv, collected)

    async def scan() -> list[int]:
        collector.worker.start()
        try:
            return await collector.scan()
        finally:
            await collector.stop()

    assert asyncio.run(scan()) == [2]
    assert (bookie.drops, collected, collector.collected) == ([2], [1], 1)


def test_a_scan_without_metadata_drops_nothing() -> None:
    bookie = FakeBookie([1, 2])
    collector = BookieGarbageCollector(bookie, lambda: [], "quorumlog")

    async def scan() -> list[int]:
        collector.worker.start()
        try:
            return await collector.scan()
        finally:
            await collector.stop()

    assert asyncio.run(scan()) == []
    assert (bookie.drops, collector.scans) == ([], 0)
