"""Ledger garbage collection on real nodes and bookies, in process (short intervals):

- a bookie that was down while a ledger topic was deleted drops the topic's ledgers by
  itself once it is back (ledger/bookie_garbage.py);
- a topic whose owner never finished deleting it (as if killed in the middle) leaves its
  ledger list, lease and ledgers, plus a ledger no list names: the "kv" leader's sweep
  removes them all (node/ledger_sweep.py);
- a live topic's ledger from an owner epoch its record is past (never to be listed) is
  swept too; the live topic keeps every ledger it lists, and every record reads back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from quorumlog.kv.client import KVClient
from quorumlog.ledger.managed_format import (
    EPOCH_PROPERTY,
    TOPIC_PROPERTY,
    decode_record,
    managed_ledger_key,
)
from quorumlog.ledger.metadata import new_ledger_metadata
from quorumlog.ledger.metadata_kv import KVMetadataStore
from quorumlog.ledger.ownership import owner_key
from quorumlog.node.bookie_process import BookieProcess, BookieProcessSettings
from quorumlog.node.server import Node
from quorumlog.stream.client_admin import Admin
from quorumlog.stream.consumer import Consumer
from quorumlog.stream.producer import Producer
from quorumlog.stream.topics import group_id

from .in_process_cluster import node_settings, start_nodes

DEADLINE_SECONDS = 30.0
INTERVAL_MS = 200
"""Both the bookies' scans and the sweep, here."""
BOOKIES = ["b0", "b1", "b2"]

Value = TypeVar("Value")


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


async def eventually_here(condition: Callable[[], bool], what: str) -> None:
    """Call `condition` on the event loop (it reads bookies' state, which lives there)
    until it is true."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Cluster:
    def __init__(self, directory: Path, nodes: list[Node]) -> None:
        self.directory = directory
        self.nodes = nodes
        self.endpoints = [node.addresses[node.node_id] for node in nodes]
        self.bookies: dict[str, BookieProcess] = {}

    async def start_bookie(self, bookie_id: str) -> BookieProcess:
        process = BookieProcess(
            BookieProcessSettings(
                bookie_id=bookie_id,
                listen="127.0.0.1:0",
                data_dir=str(self.directory / bookie_id),
                metadata=self.endpoints,
                heartbeat_ms=100,
                garbage_interval_ms=INTERVAL_MS,
            )
        )
        await process.start()
        self.bookies[bookie_id] = process
        return process

    def local_ledgers(self, bookie_id: str) -> set[int]:
        """On the event loop only."""
        server = self.bookies[bookie_id].server
        assert server is not None
        return set(server.ledger_ids())

    def create_topic(self, topic: str, ensemble: int, ack_quorum: int) -> str:
        """The managed ledger name of its partition 0."""
        with Admin(self.endpoints) as admin:
            admin.create_topic(
                topic,
                1,
                3,
                storage="ledger",
                ensemble=ensemble,
                write_quorum=ensemble,
                ack_quorum=ack_quorum,
            )
            return group_id(admin.topic_descriptor(topic), 0)

    def delete_topic(self, topic: str) -> None:
        with Admin(self.endpoints) as admin:
            admin.delete_topic(topic)

    def produce(self, topic: str, values: list[bytes]) -> None:
        with Producer(
            self.endpoints, producer_id=f"p-{topic}", linger_ms=0, batch_records_max=2
        ) as producer:
            futures = [producer.send(topic, value, partition=0) for value in values]
            producer.flush(timeout=DEADLINE_SECONDS)
            for future in futures:
                future.result(timeout=DEADLINE_SECONDS)

    def read(self, topic: str, count: int) -> list[bytes]:
        found: list[bytes] = []
        with Consumer(self.endpoints) as consumer:
            while len(found) < count:
                records = consumer.read(topic, 0, len(found), max_records=count)
                assert records, f"{topic}: nothing at offset {len(found)}"
                found += [record.value for record in records]
        return found

    def listed_ledgers(self, name: str) -> list[int]:
        with KVClient(self.endpoints, timeout=5.0) as client:
            value = client.get(managed_ledger_key(name))
        return (
            [] if value is None else [ledger.ledger_id for ledger in decode_record(value).ledgers]
        )

    def ledger_exists(self, ledger_id: int) -> bool:
        with KVClient(self.endpoints, timeout=5.0) as client:
            return KVMetadataStore(client).ledger_exists(ledger_id)

    def leftovers(self, name: str, ledger_ids: list[int]) -> list[str]:
        """Which of the name's keys and ledgers' metadata are still there."""
        with KVClient(self.endpoints, timeout=5.0) as client:
            store = KVMetadataStore(client)
            keys = [key for key in (managed_ledger_key(name), owner_key(name)) if client.get(key)]
            return keys + [f"ledger {i}" for i in ledger_ids if store.ledger_exists(i)]

    def orphan_ledger(self, name: str, epoch: int | None = None) -> int:
        """A ledger naming `name` that no list holds: its owner (of `epoch`) crashed before
        listing it."""
        properties = {TOPIC_PROPERTY: name}
        if epoch is not None:
            properties[EPOCH_PROPERTY] = str(epoch)
        with KVClient(self.endpoints, timeout=5.0) as client:
            metadata = new_ledger_metadata(
                ensemble=["b0"],
                write_quorum_size=1,
                ack_quorum_size=1,
                password=b"",
                properties=properties,
            )
            return KVMetadataStore(client).create_ledger(metadata).ledger_id


def test_deleted_topics_ledgers_are_collected_by_bookies_and_by_the_sweep(tmp_path: Path) -> None:
    settings = node_settings(
        ["n1", "n2", "n3"],
        tmp_path,
        tick_ms=10,
        election_ticks=5,
        fsync=False,
        bookie=False,  # the bookies run on their own here, so one can stop and come back
        ledger_owner_renew_ms=100,
        ledger_owner_stale_ms=600,
        ledger_rollover_records=3,
        ledger_sweep_interval_ms=INTERVAL_MS,
    )

    async def scenario() -> None:
        nodes = await start_nodes(settings)
        cluster = Cluster(tmp_path, nodes)
        try:
            for bookie_id in BOOKIES:
                await cluster.start_bookie(bookie_id)
            values = [b"live-%d" % number for number in range(8)]
            live = await asyncio.to_thread(cluster.create_topic, "gc-live", 3, 2)
            await asyncio.to_thread(cluster.produce, "gc-live", values)
            held = await held_everywhere(cluster, live)
            await check_a_bookie_down_during_a_delete(cluster)
            await check_an_unfinished_delete_is_swept(cluster)
            # A ledger of the live topic from an owner epoch its record is past: swept.
            orphan = await asyncio.to_thread(cluster.orphan_ledger, live, 0)
            await eventually(lambda: not cluster.ledger_exists(orphan), "the orphan to go")
            # Every scan and sweep so far left the live topic's own ledgers alone.
            assert await asyncio.to_thread(cluster.read, "gc-live", len(values)) == values
            for bookie_id in BOOKIES:
                assert held <= cluster.local_ledgers(bookie_id), bookie_id
        finally:
            for process in cluster.bookies.values():
                await process.stop()
            for node in nodes:
                await node.stop()

    asyncio.run(scenario())


async def held_everywhere(cluster: Cluster, name: str) -> set[int]:
    """The listed ledgers with entries, once every bookie holds them (an ensemble of 3
    acknowledges at 2 of them, so the third one's copy may still be on its way); at
    least 2 of them (a rollover happened)."""

    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        listed = set(await asyncio.to_thread(cluster.listed_ledgers, name))
        copies = [cluster.local_ledgers(bookie_id) & listed for bookie_id in BOOKIES]
        everywhere = set.intersection(*copies)
        if len(everywhere) >= 2 and everywhere == set.union(*copies):
            return everywhere
        assert time.monotonic() < deadline, f"timed out waiting for {name}'s ledgers: {copies}"
        await asyncio.sleep(0.05)


async def check_a_bookie_down_during_a_delete(cluster: Cluster) -> None:
    topic = "gc-bookie-down"
    name = await asyncio.to_thread(cluster.create_topic, topic, 3, 2)
    await asyncio.to_thread(cluster.produce, topic, [b"%d" % number for number in range(7)])
    ledgers = await held_everywhere(cluster, name)
    await cluster.bookies["b2"].stop()

    await asyncio.to_thread(cluster.delete_topic, topic)
    await eventually(lambda: not cluster.leftovers(name, sorted(ledgers)), "the delete")
    await eventually_here(
        lambda: not ledgers & (cluster.local_ledgers("b0") | cluster.local_ledgers("b1")),
        "the live bookies to drop the ledgers",
    )
    await cluster.start_bookie("b2")
    # Nobody asks it again: it still has them (its first scan is an interval away) ...
    assert ledgers <= cluster.local_ledgers("b2")
    # ... until its own scan finds their metadata gone.
    await eventually_here(lambda: not ledgers & cluster.local_ledgers("b2"), "b2 to collect them")


async def check_an_unfinished_delete_is_swept(cluster: Cluster) -> None:
    topic = "gc-unfinished"
    name = await asyncio.to_thread(cluster.create_topic, topic, 2, 2)
    await asyncio.to_thread(cluster.produce, topic, [b"%d" % number for number in range(7)])
    ledgers = await asyncio.to_thread(cluster.listed_ledgers, name)
    orphan = await asyncio.to_thread(cluster.orphan_ledger, name)
    for node in cluster.nodes:
        # The owner stops before deleting anything, as if killed at that point.
        node.streams.ledger_topics.delete_partition = lambda *_: None  # type: ignore[method-assign]

    await asyncio.to_thread(cluster.delete_topic, topic)
    await eventually(
        lambda: not cluster.leftovers(name, [*ledgers, orphan]),
        "the sweep to remove the list, the lease and the ledgers",
    )
    await eventually_here(
        lambda: not set(ledgers) & set().union(*map(cluster.local_ledgers, BOOKIES)),
        "the bookies to drop the swept ledgers",
    )
    counted = sum(
        node.observability.metrics.registry.get_sample_value(
            "quorumlog_ledger_garbage_collected_total", {"collector": "sweep"}
        )
        or 0.0
        for node in cluster.nodes
    )
    assert counted >= len(ledgers) + 1, "the sweep counts the ledgers it deleted"
