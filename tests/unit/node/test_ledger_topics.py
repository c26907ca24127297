"""Ledger-backed topics on real nodes, in process (issue 11, "Managed ledgers"): the
unchanged Producer, Consumer and Admin on a topic created with storage="ledger"; offsets
contiguous across rollovers (a ledger of 5 records here); an idempotent retry answered
with the original offsets; the owner stopped, another node taking over and producing
going on, every acknowledged record readable exactly once; deleting the topic deletes
its ledgers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from quorumlog.codec import wire
from quorumlog.kv.client import KVClient
from quorumlog.ledger.managed_format import decode_record, managed_ledger_key
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.ledger.ownership import decode_lease, owner_key
from quorumlog.node.server import Node
from quorumlog.stream.client_admin import Admin, check_topic_settings
from quorumlog.stream.consumer import Consumer
from quorumlog.stream.producer import Producer
from quorumlog.stream.topics import check_settings, group_id

from .in_process_cluster import node_settings, start_nodes
from .test_kv_requests import RawClient

DEADLINE_SECONDS = 30.0
ROLLOVER_ENTRIES = 5
TOPIC = "ledger-events"

Value = TypeVar("Value")


def settings_for(tmp_path: Path) -> list[object]:
    return list(
        node_settings(
            ["n1", "n2", "n3"],
            tmp_path,
            tick_ms=10,
            election_ticks=5,
            fsync=False,
            bookie_heartbeat_ms=100,
            ledger_owner_renew_ms=100,
            ledger_owner_stale_ms=600,
            ledger_rollover_records=ROLLOVER_ENTRIES,
        )
    )


async def eventually(
    condition: Callable[[], Value | None], what: str, seconds: float = DEADLINE_SECONDS
) -> Value:
    """Call `condition` (blocking, on a thread) until it gives something truthy."""
    deadline = time.monotonic() + seconds
    while True:
        value = await asyncio.to_thread(condition)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def endpoints_of(nodes: list[Node]) -> list[str]:
    return [node.addresses[node.node_id] for node in nodes]


def produce_values(endpoints: list[str], values: list[bytes], producer_id: str) -> list[int]:
    """Send `values` (batches of 2, so several batches span a rollover); their offsets."""
    with Producer(endpoints, producer_id=producer_id, linger_ms=0, batch_records_max=2) as p:
        futures = [p.send(TOPIC, value, partition=0) for value in values]
        p.flush(timeout=DEADLINE_SECONDS)
        return [future.result(timeout=DEADLINE_SECONDS).offset for future in futures]


def read_all(endpoints: list[str], end: int) -> list[tuple[int, bytes]]:
    with Consumer(endpoints) as consumer:
        found: list[tuple[int, bytes]] = []
        offset = 0
        while offset < end:
            records = consumer.read(TOPIC, 0, offset, max_records=3)
            assert records, f"nothing at offset {offset} (end {end})"
            found += [(record.offset, record.value) for record in records]
            offset = records[-1].offset + 1
        return found


def owner_of(endpoints: list[str], name: str) -> str | None:
    with KVClient(endpoints, timeout=5.0) as client:
        lease = decode_lease(client.get(owner_key(name)))
    return None if lease is None else lease.owner


def ledger_count(endpoints: list[str], name: str) -> int:
    with KVClient(endpoints, timeout=5.0) as client:
        value = client.get(managed_ledger_key(name))
    return 0 if value is None else len(decode_record(value).ledgers)


def test_a_ledger_topic_keeps_offsets_contiguous_across_rollovers_and_an_owner_change(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        nodes = await start_nodes(settings_for(tmp_path))  # type: ignore[arg-type]
        stopped: list[Node] = []
        try:
            await check_topic(nodes, stopped)
        finally:
            for node in nodes:
                if node not in stopped:
                    await node.stop()

    asyncio.run(scenario())


async def check_topic(nodes: list[Node], stopped: list[Node]) -> None:
    endpoints = endpoints_of(nodes)

    def create() -> wire.TopicDescriptor:
        with Admin(endpoints) as admin:
            admin.create_topic(
                TOPIC, 1, 3, storage="ledger", ensemble=2, write_quorum=2, ack_quorum=2
            )
            description = admin.describe_topic(TOPIC)
            assert (description.storage, description.ensemble) == ("ledger", 2)
            return admin.topic_descriptor(TOPIC)

    descriptor = await asyncio.to_thread(create)
    name = group_id(descriptor, 0)
    first = [b"first-%d" % number for number in range(12)]
    offsets = await asyncio.to_thread(produce_values, endpoints, first, "producer-a")
    assert offsets == list(range(12)), "offsets contiguous across rollovers"
    ledgers = await asyncio.to_thread(ledger_count, endpoints, name)
    # A ledger rolls over after the batch that reaches 5 records: 6 records each here.
    assert ledgers >= 2, f"{ledgers} ledgers: no rollover happened"

    owner = await eventually(lambda: owner_of(endpoints, name), "an owner")
    owner_node = next(node for node in nodes if node.node_id == owner)
    await check_idempotent_retry(owner_node, 12)

    await owner_node.stop()
    stopped.append(owner_node)
    survivors = [node for node in nodes if node is not owner_node]
    live = endpoints_of(survivors)
    await eventually(
        lambda: owner_of(live, name) not in (None, owner), "another node to own the partition"
    )
    second = [b"second-%d" % number for number in range(7)]
    offsets = await asyncio.to_thread(produce_values, live, second, "producer-b")
    assert offsets == list(range(13, 20)), "the new owner goes on where the old one stopped"
    found = await asyncio.to_thread(read_all, live, 20)
    expected = [*enumerate(first), (12, b"retried"), *zip(range(13, 20), second, strict=True)]
    assert found == expected, "every acknowledged record, once, in order"
    await check_delete(live, name)


async def check_delete(endpoints: list[str], name: str) -> None:
    """Deleting the topic deletes its ledgers, its ledger list and its lease."""

    def delete() -> None:
        with Admin(endpoints) as admin:
            admin.delete_topic(TOPIC)

    def all_gone() -> bool:
        with KVClient(endpoints, timeout=5.0) as client:
            keys = [client.get(managed_ledger_key(name)), client.get(owner_key(name))]
            ledgers = KVMetadataStore(client).list_ledgers()
        return keys == [None, None] and not ledgers

    await asyncio.to_thread(delete)
    await eventually(all_gone, "the deleted topic's ledgers, list and lease to go")


async def check_idempotent_retry(owner: Node, next_offset: int) -> None:
    """The same batch sent twice: the second answer is a duplicate with the first's offset."""
    client = await RawClient.connect(owner.port)
    try:
        answers = []
        for request_id in (1, 2):
            answer = await client.ask(
                wire.Produce(
                    request_id=request_id,
                    topic=TOPIC,
                    partition=0,
                    producer_id="raw-producer",
                    base_sequence=0,
                    records=[wire.Record(b"retried")],
                )
            )
            assert isinstance(answer, wire.ProduceResult), answer
            answers.append((answer.base_offset, answer.count, answer.duplicate))
        assert answers == [(next_offset, 1, False), (next_offset, 1, True)]
    finally:
        await client.close()


def test_ledger_topic_settings_are_checked_on_both_sides() -> None:
    bad_quorums = wire.TopicSettings(1, 3, storage="ledger", ensemble=2, write_quorum=3)
    with pytest.raises(ValueError, match="ack_quorum <= write_quorum <= ensemble"):
        check_topic_settings(bad_quorums)
    assert "ack_quorum <= write_quorum" in (check_settings(TOPIC, bad_quorums, 3) or "")
    unknown = wire.TopicSettings(1, 3, storage="tape")
    assert "storage must be one of" in (check_settings(TOPIC, unknown, 3) or "")
    assert check_settings(TOPIC, wire.TopicSettings(1, 3, storage="ledger"), 3) is None
