"""A failed sync on an HA master, on real nodes in process: the produce waiting for it is
answered (UNAVAILABLE, an unknown outcome) instead of hanging until a restart; the Producer's
retry lands once at the master the controller elects from the SyncStateSet; the node's other
partition goes on; after a full disk the node reopens the partition's log and the broker
rejoins as a slave."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from quorumlog.codec import wire
from quorumlog.errors import DiskFullError
from quorumlog.ha.broker_host import BrokerHost
from quorumlog.ha.controller_model import BrokerGroupInfo
from quorumlog.ha.epoch_file import EpochFile
from quorumlog.node import ha_topics
from quorumlog.node.server import Node
from quorumlog.stream.client_admin import Admin
from quorumlog.stream.topics import group_id

from .in_process_cluster import start_nodes
from .test_ha_topics import TOPIC, broker_status, full_set, group_info, settings_for
from .test_ledger_topics import endpoints_of, eventually

REOPEN_SECONDS = 1.5
"""Longer than the controller's broker timeout here (0.8 s): the group elects first."""


class FailingSyncs:
    """The next sync reports a full disk without running (on the loop, as the pool does);
    later ones go to the service's pool."""

    def __init__(self, host: BrokerHost) -> None:
        self.host = host
        self.pool = host.background
        self.failed = False

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        if self.failed:
            self.pool.submit(job, done)
            return
        self.failed = True
        error = DiskFullError("disk full while writing the commit log: [Errno 28]")
        asyncio.get_running_loop().call_soon(done, error)


def produce_to(endpoints: list[str], partition: int, values: list[bytes], name: str) -> list[int]:
    from quorumlog.stream.producer import Producer

    with Producer(endpoints, producer_id=name, linger_ms=0, batch_records_max=2) as producer:
        futures = [producer.send(TOPIC, value, partition=partition) for value in values]
        producer.flush(timeout=30.0)
        return [future.result(timeout=30.0).offset for future in futures]


def read_partition(endpoints: list[str], partition: int, end: int) -> list[tuple[int, bytes]]:
    from quorumlog.stream.consumer import Consumer

    with Consumer(endpoints) as consumer:
        found: list[tuple[int, bytes]] = []
        while len(found) < end:
            records = consumer.read(TOPIC, partition, len(found), max_records=100)
            assert records, f"nothing at offset {len(found)} of partition {partition}"
            found += [(record.offset, record.value) for record in records]
        return found


class EpochFileFailingOnce(EpochFile):
    """The first epoch file opened fails (an unreadable file at the first reopen); the
    next reopen must find the log's directory lock free."""

    failures_left = 0

    def __init__(self, path: Path) -> None:
        if EpochFileFailingOnce.failures_left:
            EpochFileFailingOnce.failures_left -= 1
            raise OSError(errno.EIO, "Input/output error", str(path))
        super().__init__(path)


def test_a_failed_master_sync_answers_fails_over_and_reopens_after_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ha_topics, "EpochFile", EpochFileFailingOnce)

    async def scenario() -> None:
        nodes = await start_nodes(settings_for(tmp_path))  # type: ignore[arg-type]
        for node in nodes:
            node.streams.ha_topics.disk_full_reopen_seconds = REOPEN_SECONDS
        try:
            await check_sync_failure(nodes)
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(scenario())


async def check_sync_failure(nodes: list[Node]) -> None:
    endpoints = endpoints_of(nodes)

    def create() -> wire.TopicDescriptor:
        with Admin(endpoints) as admin:
            admin.create_topic(TOPIC, 2, 3, storage="ha")
            return admin.topic_descriptor(TOPIC)

    descriptor = await asyncio.to_thread(create)
    names = [group_id(descriptor, partition) for partition in (0, 1)]
    infos = [await eventually(lambda n=n: full_set(endpoints, n, 3), "a full set") for n in names]
    first = [b"first-%d" % number for number in range(6)]
    assert await asyncio.to_thread(produce_to, endpoints, 0, first, "p-first") == list(range(6))
    master = next(node for node in nodes if node.node_id == infos[0].master_id)
    service = master.streams.ha_topics
    failed = service.serves(TOPIC, 0)
    assert failed is not None and failed.host.is_master
    failed.host.background = FailingSyncs(failed.host)
    EpochFileFailingOnce.failures_left = 1  # the first reopen fails; the second must not

    second = [b"second-%d" % number for number in range(4)]
    offsets = await asyncio.to_thread(produce_to, endpoints, 0, second, "p-second")
    assert offsets == list(range(6, 10)), "retried once at the next master, no gap, no copy"
    assert failed.host.failure is not None and failed.host.failure.disk_full

    def elected() -> BrokerGroupInfo | None:
        info = group_info(endpoints, names[0])
        return info if info and info.master_id not in (None, master.node_id) else None

    new = await eventually(elected, "a master other than the failed one")
    assert new.master_id in infos[0].sync_state_set
    found = await asyncio.to_thread(read_partition, endpoints, 0, 10)
    assert found == list(enumerate([*first, *second])), "every record once, in order"

    # The node's other partition was not touched.
    other = service.serves(TOPIC, 1)
    assert other is not None and other.host.failure is None
    assert await asyncio.to_thread(produce_to, endpoints, 1, [b"other"], "p-other") == [0]

    # After the full disk, the node reopens the log: the broker rejoins as a slave.
    await eventually(lambda: service.reopens == 1 or None, "the partition reopened")
    assert EpochFileFailingOnce.failures_left == 0, "the first reopen failed and was retried"

    def rejoined() -> bool | None:
        status = broker_status(endpoints, names[0], master.node_id)
        return (status.role == "slave" and full_set(endpoints, names[0], 3) is not None) or None

    await eventually(rejoined, "the reopened broker back in the SyncStateSet")
    reopened = service.serves(TOPIC, 0)
    assert reopened is not None and reopened is not failed and reopened.host.failure is None


def test_a_failed_master_append_is_retried_once_at_the_next_master(tmp_path: Path) -> None:
    """The append itself fails (a full disk): the producer table had admitted the batch, so
    before, the retry was answered as a duplicate of a batch never written."""

    async def scenario() -> None:
        nodes = await start_nodes(settings_for(tmp_path))  # type: ignore[arg-type]
        try:
            await check_append_failure(nodes)
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(scenario())


async def check_append_failure(nodes: list[Node]) -> None:
    endpoints = endpoints_of(nodes)

    def create() -> wire.TopicDescriptor:
        with Admin(endpoints) as admin:
            admin.create_topic(TOPIC, 1, 3, storage="ha")
            return admin.topic_descriptor(TOPIC)

    name = group_id(await asyncio.to_thread(create), 0)
    info = await eventually(lambda: full_set(endpoints, name, 3), "a full set")
    first = [b"first-%d" % number for number in range(4)]
    assert await asyncio.to_thread(produce_to, endpoints, 0, first, "p-first") == list(range(4))
    master = next(node for node in nodes if node.node_id == info.master_id)
    part = master.streams.ha_topics.serves(TOPIC, 0)
    assert part is not None
    log = part.commit_log
    append = log.append

    def full_once(messages: Sequence[bytes], epoch: int) -> int:
        log.append = append  # type: ignore[method-assign]
        raise DiskFullError("disk full while writing the commit log: [Errno 28]")

    log.append = full_once  # type: ignore[method-assign]
    second = [b"second-%d" % number for number in range(4)]
    offsets = await asyncio.to_thread(produce_to, endpoints, 0, second, "p-second")
    assert offsets == list(range(4, 8))
    assert part.host.failure is not None and part.host.failure.disk_full
    found = await asyncio.to_thread(read_partition, endpoints, 0, 8)
    assert found == list(enumerate([*first, *second])), "every record once, in order"
