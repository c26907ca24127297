"""HA-replicated topics on real nodes, in process (issue 12, reference 003): the unchanged
Producer, Consumer and Admin on a topic created with storage="ha"; an idempotent retry
answered with the original offsets; the master stopped, the controller electing a
SyncStateSet member that takes over, every acknowledged record readable exactly once; the
old master restarted, truncating its unacknowledged tail at handshake."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import NotEnoughReplicasError, RequestRejectedError, UnavailableError
from quorumlog.ha.broker_host import BrokerStatus
from quorumlog.ha.controller_client import HAControllerClient
from quorumlog.ha.controller_model import BrokerGroupInfo
from quorumlog.node.addresses import AddressSource
from quorumlog.node.server import Node
from quorumlog.stream.client_admin import Admin
from quorumlog.stream.topics import group_id

from .in_process_cluster import node_settings, start_nodes
from .test_kv_requests import RawClient
from .test_ledger_topics import endpoints_of, eventually

TOPIC = "ha-events"
DEADLINE_SECONDS = 30.0


def settings_for(tmp_path: Path) -> list[object]:
    return list(
        node_settings(
            ["n1", "n2", "n3"],
            tmp_path,
            tick_ms=10,
            election_ticks=5,
            fsync=False,
            bookie=False,
            ha_broker_heartbeat_timeout_ms=800,
            ha_controller_check_ms=100,
        )
    )


def produce_values(endpoints: list[str], values: list[bytes], producer_id: str) -> list[int]:
    from quorumlog.stream.producer import Producer

    with Producer(endpoints, producer_id=producer_id, linger_ms=0, batch_records_max=2) as p:
        futures = [p.send(TOPIC, value, partition=0) for value in values]
        p.flush(timeout=DEADLINE_SECONDS)
        return [future.result(timeout=DEADLINE_SECONDS).offset for future in futures]


def read_all(endpoints: list[str], end: int) -> list[tuple[int, bytes]]:
    from quorumlog.stream.consumer import Consumer

    with Consumer(endpoints) as consumer:
        found: list[tuple[int, bytes]] = []
        offset = 0
        while offset < end:
            records = consumer.read(TOPIC, 0, offset, max_records=3)
            assert records, f"nothing at offset {offset} (end {end})"
            found += [(record.offset, record.value) for record in records]
            offset = records[-1].offset + 1
        return found


def group_info(endpoints: list[str], name: str) -> BrokerGroupInfo | None:
    with HAControllerClient(endpoints, timeout=5.0) as client:
        try:
            return client.get_group(name)
        except KeyError:
            return None


def full_set(endpoints: list[str], name: str, size: int) -> BrokerGroupInfo | None:
    info = group_info(endpoints, name)
    return info if info is not None and len(info.sync_state_set) >= size else None


def broker_status(endpoints: list[str], name: str, broker_id: str) -> BrokerStatus:
    with HAControllerClient(endpoints, timeout=5.0) as client:
        return client.broker_status(name, broker_id)


def test_an_ha_topic_fails_over_within_the_sync_state_set(tmp_path: Path) -> None:
    async def scenario() -> None:
        nodes = await start_nodes(settings_for(tmp_path))  # type: ignore[arg-type]
        stopped: list[Node] = []
        try:
            await check_topic(nodes, stopped, tmp_path)
        finally:
            for node in nodes:
                if node not in stopped:
                    await node.stop()

    asyncio.run(scenario())


async def check_topic(nodes: list[Node], stopped: list[Node], tmp_path: Path) -> None:
    endpoints = endpoints_of(nodes)

    def create() -> wire.TopicDescriptor:
        with Admin(endpoints) as admin:
            admin.create_topic(TOPIC, 1, 3, storage="ha")
            assert admin.describe_topic(TOPIC).storage == "ha"
            return admin.topic_descriptor(TOPIC)

    descriptor = await asyncio.to_thread(create)
    name = group_id(descriptor, 0)
    info = await eventually(lambda: full_set(endpoints, name, 3), "a full SyncStateSet")
    first = [b"first-%d" % number for number in range(10)]
    offsets = await asyncio.to_thread(produce_values, endpoints, first, "producer-a")
    assert offsets == list(range(10))
    master = next(node for node in nodes if node.node_id == info.master_id)
    await check_slaves_index_as_they_go(nodes, master)
    await check_idempotent_retry(master, 10)

    await master.stop()
    stopped.append(master)
    survivors = [node for node in nodes if node is not master]
    live = endpoints_of(survivors)

    def new_master() -> BrokerGroupInfo | None:
        found = group_info(live, name)
        return found if found and found.master_id not in (None, master.node_id) else None

    elected = await eventually(new_master, "a new master")
    assert elected.master_id in info.sync_state_set
    assert elected.master_epoch == info.master_epoch + 1
    second = [b"second-%d" % number for number in range(5)]
    offsets = await asyncio.to_thread(produce_values, live, second, "producer-b")
    assert offsets == list(range(11, 16)), "the new master goes on where the old one stopped"
    found = await asyncio.to_thread(read_all, live, 16)
    expected = [*enumerate(first), (10, b"retried"), *zip(range(11, 16), second, strict=True)]
    assert found == expected, "every acknowledged record, once, in order"
    status = await asyncio.to_thread(broker_status, live, name, str(elected.master_id))
    assert status.role == "master"
    assert [entry.epoch for entry in status.epochs] == [info.master_epoch, elected.master_epoch]
    await check_old_master_rejoins(master, nodes, name, status)


async def check_old_master_rejoins(
    old: Node, nodes: list[Node], name: str, master: BrokerStatus
) -> None:
    """The old master, restarted, follows the new one: its log ends where the master's
    does and its epoch file matches, and it is back in the SyncStateSet."""
    restarted = Node(old.settings)
    await restarted.start()
    nodes.append(restarted)  # stopped with the others at the end
    running = [node for node in nodes if node is not old]
    addresses = {node.node_id: node.addresses[node.node_id] for node in running}
    for node in running:
        node.learn_addresses(addresses, AddressSource.OPERATOR)
    endpoints = endpoints_of(running)

    def caught_up() -> BrokerStatus | None:
        try:
            status = broker_status(endpoints, name, old.node_id)
        except (RequestRejectedError, UnavailableError):  # the restarted node is starting
            return None
        return status if status.max_offset == master.max_offset else None

    status = await eventually(caught_up, "the old master to catch up as a slave")
    assert status.role == "slave"
    assert status.epochs == master.epochs
    await eventually(lambda: full_set(endpoints, name, 3), "the old master back in sync")


async def check_slaves_index_as_they_go(nodes: list[Node], master: Node) -> None:
    """Each slave indexes what it receives, so becoming master reads only the tail."""

    def slaves_indexed() -> bool | None:
        for node in nodes:
            part = node.streams.ha_topics.serves(TOPIC, 0)
            if node is master or part is None:
                continue
            if part.index.indexed_end != part.commit_log.max_offset:
                return None
        return True

    await eventually(slaves_indexed, "the slaves to index their logs")


async def check_idempotent_retry(master: Node, next_offset: int) -> None:
    client = await RawClient.connect(master.port)
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


def test_a_master_alone_in_its_sync_state_set_refuses_produces_typed(tmp_path: Path) -> None:
    """Replication 2 (min_in_sync 2): the slave's node stops, the master shrinks the
    SyncStateSet to itself and refuses produces with NOT_ENOUGH_REPLICAS; the Producer
    retries them until its timeout and raises NotEnoughReplicasError."""

    async def scenario() -> None:
        nodes = await start_nodes(settings_for(tmp_path))  # type: ignore[arg-type]
        for node in nodes:
            # A slave not caught up leaves the set after 0.5 s, not 3 s: the test is about
            # the refusal, not the shrink's timing (the simulator checks that).
            service = node.streams.ha_topics
            service.config = msgspec.structs.replace(
                service.config,
                replication=msgspec.structs.replace(
                    service.config.replication, ha_max_time_slave_not_catch_up_ms=500
                ),
            )
        stopped: list[Node] = []
        try:
            await check_refusal(nodes, stopped)
        finally:
            for node in nodes:
                if node not in stopped:
                    await node.stop()

    asyncio.run(scenario())


async def check_refusal(nodes: list[Node], stopped: list[Node]) -> None:
    endpoints = endpoints_of(nodes)

    def create() -> wire.TopicDescriptor:
        with Admin(endpoints) as admin:
            admin.create_topic(TOPIC, 1, 2, storage="ha")
            return admin.topic_descriptor(TOPIC)

    descriptor = await asyncio.to_thread(create)
    name = group_id(descriptor, 0)
    info = await eventually(lambda: full_set(endpoints, name, 2), "a full SyncStateSet")
    assert await asyncio.to_thread(produce_values, endpoints, [b"kept"], "p") == [0]
    slave = next(node for node in nodes if node.node_id in info.sync_state_set)
    if slave.node_id == info.master_id:
        slave = next(n for n in nodes if n.node_id in info.sync_state_set and n is not slave)
    await slave.stop()
    stopped.append(slave)
    live = endpoints_of([node for node in nodes if node is not slave])

    def shrunk() -> BrokerGroupInfo | None:
        found = group_info(live, name)
        return found if found is not None and found.sync_state_set == [info.master_id] else None

    await eventually(shrunk, "the SyncStateSet to shrink to the master")

    def refused() -> BaseException | None:
        from quorumlog.stream.producer import Producer

        # Long enough that a loaded machine answers at least one attempt in time: the last
        # answer, a refusal, is what the producer reports (a timeout would be unknown).
        with Producer(live, producer_id="q", delivery_timeout_seconds=3.0) as producer:
            return producer.send(TOPIC, b"refused", partition=0).exception(timeout=30)

    problem = await asyncio.to_thread(refused)
    assert isinstance(problem, NotEnoughReplicasError), problem
    assert isinstance(problem, UnavailableError), "nothing was written"
    await check_retention_refused_and_delete_removes_files(nodes, stopped, name)


async def check_retention_refused_and_delete_removes_files(
    nodes: list[Node], stopped: list[Node], name: str
) -> None:
    """Retention is refused for an HA topic (its brokers would keep every record); deleting
    the topic removes its commit log and epoch file on every live node."""
    live_nodes = [node for node in nodes if node not in stopped]
    live = endpoints_of(live_nodes)
    directories = [
        node.streams.ha_topics.partition_directory(name)
        for node in live_nodes
        if node.streams.ha_topics.serves(TOPIC, 0) is not None
    ]
    assert directories and all(directory.exists() for directory in directories)

    def create_with_retention() -> BaseException | None:
        with Admin(live) as admin:
            try:
                admin.create_topic("ha-retained", 1, 2, storage="ha", retention_ms=60_000)
            except (ValueError, RequestRejectedError) as error:  # the client checks first
                return error
        return None

    refusal = await asyncio.to_thread(create_with_retention)
    assert refusal is not None and "retention" in str(refusal)

    def delete() -> None:
        with Admin(live) as admin:
            admin.delete_topic(TOPIC)

    await asyncio.to_thread(delete)
    await eventually(
        lambda: all(not directory.exists() for directory in directories) or None,
        "the deleted topic's HA files to go",
    )
