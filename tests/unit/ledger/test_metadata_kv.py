"""KVMetadataStore on a real one-node metadata group: ids from the counter, CAS updates that
check the version, deletes, listing (KVClient.scan_prefix), bookie registrations judged by
liveness; and a LedgerClient whose metadata lives there end to end."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import msgspec
import pytest
from click.testing import CliRunner

from quorumlog import LedgerClient
from quorumlog.cli.main import cli
from quorumlog.errors import (
    BadPasswordError,
    LedgerFencedError,
    LedgerMetadataConflictError,
    LedgerNotFoundError,
)
from quorumlog.kv.client import KVClient
from quorumlog.kv.internal_keys import InternalKeys
from quorumlog.ledger.metadata import LedgerMetadata, LedgerState, new_ledger_metadata
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.ledger.registry import (
    BOOKIE_LIVENESS_SECONDS,
    NEXT_LEDGER_ID_KEY,
    BookieRecord,
    bookie_key,
    encode_bookie_record,
    ledger_key,
)
from tests.unit.ledger.live_bookies import LiveBookies


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveBookies]:
    live = LiveBookies(tmp_path_factory.mktemp("metadata"), 4, metadata_node=True)
    try:
        yield live
    finally:
        live.close()


@pytest.fixture
def kv(cluster: LiveBookies) -> Iterator[KVClient]:
    with KVClient(cluster.endpoints, timeout=10) as client:
        yield client


def metadata_for(bookies: list[str]) -> LedgerMetadata:
    return new_ledger_metadata(
        ensemble=bookies, write_quorum_size=2, ack_quorum_size=2, password=b"pw"
    )


def test_ids_come_from_the_counter_and_updates_check_the_version(kv: KVClient) -> None:
    store = KVMetadataStore(kv)
    first = store.create_ledger(metadata_for(["b0", "b1", "b2"]))
    second = store.create_ledger(metadata_for(["b1", "b2", "b3"]))
    assert second.ledger_id == first.ledger_id + 1
    assert (first.version, second.version) == (0, 0)
    assert int(kv.get(NEXT_LEDGER_ID_KEY) or "0") == second.ledger_id + 1
    assert store.read_ledger(first.ledger_id) == first

    marked = first.updated(state=LedgerState.IN_RECOVERY)
    assert store.update_ledger(marked, expected_version=0) == marked
    assert store.read_ledger(first.ledger_id).version == 1
    with pytest.raises(LedgerMetadataConflictError) as conflict:
        store.update_ledger(first.updated(state=LedgerState.CLOSED), expected_version=0)
    assert conflict.value.actual_version == 1
    with pytest.raises(ValueError):
        store.update_ledger(marked, expected_version=1)  # must store version 2
    missing = msgspec.structs.replace(marked, ledger_id=10**9, version=1)
    with pytest.raises(LedgerNotFoundError):
        store.update_ledger(missing, expected_version=0)

    with pytest.raises(LedgerMetadataConflictError):
        store.delete_ledger(second.ledger_id, expected_version=3)
    listed = store.list_ledgers()
    assert listed == sorted(listed)
    assert {first.ledger_id, second.ledger_id} <= set(listed)
    store.delete_ledger(second.ledger_id, expected_version=0)
    assert second.ledger_id not in store.list_ledgers()
    with pytest.raises(LedgerNotFoundError):
        store.read_ledger(second.ledger_id)
    with pytest.raises(LedgerNotFoundError):
        store.delete_ledger(second.ledger_id)
    # Ids are never reused, even after a delete.
    third = store.create_ledger(metadata_for(["b0", "b1", "b2"]))
    assert third.ledger_id == second.ledger_id + 1


def test_a_key_taken_by_something_else_burns_the_id(kv: KVClient) -> None:
    store = KVMetadataStore(kv)
    next_id = int(kv.get(NEXT_LEDGER_ID_KEY) or "0")
    InternalKeys(kv).put(ledger_key(next_id), "not metadata")
    created = store.create_ledger(metadata_for(["b0", "b1", "b2"]))
    assert created.ledger_id == next_id + 1
    InternalKeys(kv).delete(ledger_key(next_id))


def test_scan_prefix_reads_every_page_in_key_order(kv: KVClient) -> None:
    for number in range(7):
        kv.put(f"scan-test/{number:02d}", str(number))
    kv.put("scan-test0", "outside the prefix")
    items = kv.scan_prefix("scan-test/", page_keys=2)
    assert items == [(f"scan-test/{number:02d}", str(number)) for number in range(7)]


def test_only_live_writable_registrations_are_offered(cluster: LiveBookies, kv: KVClient) -> None:
    now_ms = int(time.time() * 1000)
    records = {
        "old": BookieRecord(
            bookie_id="old",
            address="127.0.0.1:1",
            writable=True,
            heartbeat_ms=now_ms - int(BOOKIE_LIVENESS_SECONDS * 1000) - 1,
        ),
        "full": BookieRecord(
            bookie_id="full", address="127.0.0.1:2", writable=False, heartbeat_ms=now_ms
        ),
    }
    for bookie_id, record in records.items():
        InternalKeys(kv).put(bookie_key(bookie_id), encode_bookie_record(record))
    InternalKeys(kv).put(bookie_key("garbage"), "{not json")
    store = KVMetadataStore(kv, clock_ms=lambda: now_ms)
    writable = [bookie.bookie_id for bookie in store.writable_bookies()]
    assert writable == sorted(cluster.servers)
    listed = [record.bookie_id for record in store.all_bookies()]
    assert listed == sorted([*cluster.servers, "old", "full"])
    assert store.bookie_address("b0") == cluster.addresses["b0"]
    assert store.bookie_address("nobody") is None
    for bookie_id in [*records, "garbage"]:
        InternalKeys(kv).delete(bookie_key(bookie_id))


def test_a_ledger_client_on_the_metadata_group_writes_recovers_and_deletes(
    cluster: LiveBookies,
) -> None:
    with LedgerClient(cluster.endpoints, timeout=10) as writer_client:
        handle = writer_client.create_ledger(password=b"pw")
        futures = [handle.append_async(b"entry-%d" % number) for number in range(100)]
        assert [future.result(timeout=10) for future in futures] == list(range(100))
        with LedgerClient(cluster.endpoints, timeout=10) as recovering_client:
            reader = recovering_client.open_ledger(handle.ledger_id, b"pw")
            assert reader.last_add_confirmed >= 99
            with pytest.raises(LedgerFencedError):
                handle.append(b"fenced")
            info = recovering_client.ledger_metadata(handle.ledger_id)
            assert info.state == "CLOSED"
            assert info.last_entry_id == reader.last_add_confirmed
            assert info.version >= 2  # IN_RECOVERY, then CLOSED
            entries = reader.read(0, 99)
            assert [entry.data for entry in entries] == [b"entry-%d" % n for n in range(100)]
            recovering_client.delete_ledger(handle.ledger_id)
        assert handle.ledger_id not in writer_client.list_ledgers()


def test_the_ledger_command_lists_reads_recovers_and_deletes(cluster: LiveBookies) -> None:
    with LedgerClient(cluster.endpoints, timeout=10) as client:
        handle = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        for number in range(5):
            handle.append(b"line-%d" % number)
        ledger_id = handle.ledger_id
    runner = CliRunner()
    common = ["--endpoints", ",".join(cluster.endpoints), "--timeout", "10"]

    def run(*arguments: str) -> str:
        result = runner.invoke(cli, ["ledger", *arguments, *common])
        assert result.exit_code == 0, result.output + repr(result.exception)
        return result.output

    listed = json.loads(run("list", "-w", "json"))
    assert ledger_id in [info["ledger_id"] for info in listed]
    assert str(ledger_id) in run("list")
    metadata = json.loads(run("metadata", str(ledger_id), "-w", "json"))
    assert (metadata["state"], metadata["ensemble_size"]) == ("OPEN", 3)
    assert len(metadata["ensembles"]["0"]) == 3

    # Not recovered: the bookies' LAC lags the last acknowledged entry by the piggyback.
    entries = json.loads(run("read", str(ledger_id), "--password", "pw", "-w", "json"))
    assert [entry["data"] for entry in entries] == [f"line-{n}" for n in range(4)]
    assert "line-1" in run("read", str(ledger_id), "--password", "pw", "--first", "1")

    recovered = json.loads(run("recover", str(ledger_id), "--password", "pw", "-w", "json"))
    assert (recovered["state"], recovered["last_entry_id"]) == ("CLOSED", 4)
    entries = json.loads(run("read", str(ledger_id), "--password", "pw", "-w", "json"))
    assert len(entries) == 5

    wrong = runner.invoke(cli, ["ledger", "read", str(ledger_id), "--password", "x", *common])
    assert wrong.exit_code != 0
    assert isinstance(wrong.exception, BadPasswordError)

    assert f"deleted ledger {ledger_id}" in run("delete", str(ledger_id))
    assert ledger_id not in [info["ledger_id"] for info in json.loads(run("list", "-w", "json"))]
