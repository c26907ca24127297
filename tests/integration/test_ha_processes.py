"""HA-replicated topics (issue 12, reference 003) on three real `quorumlog node` processes
with fsync on, under the faults the issue names:

- the master SIGKILLed mid-produce: a SyncStateSet member takes over at MasterEpoch + 1,
  and the queue checker finds nothing acknowledged lost and nothing written twice;
- the master paused (SIGSTOP) mid-produce: the controller elects another master; resumed,
  the old master follows it as a slave (truncating at handshake whatever it held that the
  new master does not) and ends with the same log end and the same epoch file;
- the master's node also leading the controller ("ha-controller" group), killed, and the
  controller left without a majority for longer than the heartbeat timeout: the next
  controller leader elects once (MasterEpoch + 1, one new master) and produce goes on.

Every wait is a condition polled until a deadline (`wait_until`); the one sleep is the
length of a fault, not a wait for its outcome.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import msgspec
from click.testing import CliRunner

from quorumlog import Admin, Consumer, Producer
from quorumlog.cli.main import cli
from quorumlog.codec.wire import HA_CONTROLLER_GROUP, StatusRequest, StatusResponse
from quorumlog.errors import ClientError
from quorumlog.ha.broker_host import BrokerStatus
from quorumlog.ha.controller_client import HAControllerClient
from quorumlog.ha.controller_machine import BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT
from quorumlog.ha.controller_model import BrokerGroupInfo
from quorumlog.stream.records import RecordMetadata
from quorumlog.stream.topics import group_id
from quorumlog.testing.queue_checker import ConsumedRecord, ProducedRecord, check_queue

from .process_cluster import ProcessCluster, request_frame, wait_until
from .test_stream_cluster import acknowledged, outcome, read_all

TOPIC = "ha-queue"
WAIT_SECONDS = 20.0
ACKNOWLEDGED_PER_PHASE = 1000
"""Records acknowledged before a fault and again after it: enough that the fault lands
among produces in flight, few enough that each test stays within seconds."""

CONTROLLER_OUTAGE_SECONDS = 1.5 * BROKER_HEARTBEAT_TIMEOUT_MS_DEFAULT / 1000
"""How long the controller has no majority in the #7689 test: past the heartbeat timeout."""

Sent = list[tuple[str, Future[RecordMetadata]]]


# --- helpers -------------------------------------------------------------------------------


def create_topic(cluster: ProcessCluster) -> str:
    """The HA topic (one partition on all three nodes); its broker group's name."""
    cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
    with Admin(cluster.endpoints, cluster_id=cluster.cluster_id) as admin:
        admin.create_topic(TOPIC, 1, 3, storage="ha")
        return group_id(admin.topic_descriptor(TOPIC), 0)


def group_info(endpoints: list[str], cluster_id: str, group: str) -> BrokerGroupInfo | None:
    try:
        with HAControllerClient(endpoints, timeout=2.0, cluster_id=cluster_id) as client:
            return client.get_group(group)
    except (KeyError, ClientError):  # not registered yet, or no controller leader now
        return None


def wait_for_full_set(cluster: ProcessCluster, group: str) -> BrokerGroupInfo:
    def full() -> BrokerGroupInfo | None:
        info = group_info(cluster.endpoints, cluster.cluster_id, group)
        return info if info is not None and len(info.sync_state_set) == 3 else None

    return wait_until(full, WAIT_SECONDS, "all three brokers in the SyncStateSet")


def wait_for_new_master(
    endpoints: list[str], cluster_id: str, group: str, old_master: str
) -> BrokerGroupInfo:
    def elected() -> BrokerGroupInfo | None:
        info = group_info(endpoints, cluster_id, group)
        return info if info is not None and info.master_id not in (None, old_master) else None

    return wait_until(elected, WAIT_SECONDS, f"a master other than {old_master}")


def broker_status(
    endpoints: list[str], cluster_id: str, group: str, broker_id: str
) -> BrokerStatus | None:
    try:
        with HAControllerClient(endpoints, timeout=2.0, cluster_id=cluster_id) as client:
            return client.broker_status(group, broker_id)
    except ClientError:  # the node is starting, paused or between roles
        return None


def controller_leader(cluster: ProcessCluster) -> str | None:
    """The node that says it leads the "ha-controller" group in the newest term."""
    answers: list[StatusResponse] = []
    for node_id, node in cluster.nodes.items():
        if not node.running or node.paused:
            continue
        try:
            frame = request_frame(
                cluster.address(node_id),
                StatusRequest(request_id=1, group=HA_CONTROLLER_GROUP),
                cluster.cluster_id,
                0.5,
            )
        except (OSError, TimeoutError, ValueError):
            continue
        if isinstance(frame, StatusResponse):
            answers.append(frame)
    leaders = [answer for answer in answers if answer.is_leader]
    if not leaders:
        return None
    newest = max(answer.term for answer in answers)
    current = [answer.node_id for answer in leaders if answer.term == newest]
    return current[0] if current else None


@contextmanager
def producing(cluster: ProcessCluster) -> Iterator[Sent]:
    """Produce unique values to the topic from a thread until the block ends; yields the
    (value, future) list as it grows. Every 50th send waits for its answer, so the
    producer's buffer never runs far ahead of the partition."""
    sent: Sent = []
    stop = threading.Event()
    with Producer(cluster.endpoints, cluster_id=cluster.cluster_id, linger_ms=1) as producer:

        def produce_until_stopped() -> None:
            number = 0
            while not stop.is_set():
                value = f"value-{number}"
                sent.append((value, producer.send(TOPIC, value.encode(), partition=0)))
                number += 1
                if number % 50 == 0:
                    sent[-1][1].exception(timeout=WAIT_SECONDS * 2)

        worker = threading.Thread(target=produce_until_stopped, daemon=True)
        worker.start()
        try:
            yield sent
        finally:
            stop.set()
            worker.join(timeout=WAIT_SECONDS * 2)
            producer.flush()


def wait_for_acknowledged(sent: Sent, count: int, what: str) -> None:
    wait_until(lambda: acknowledged(sent) >= count, WAIT_SECONDS * 2, what)


def check_nothing_lost_or_doubled(
    endpoints: list[str], cluster_id: str, sent: Sent, acknowledged_min: int
) -> None:
    produced: list[ProducedRecord] = [outcome(value, future) for value, future in sent]
    with Consumer(endpoints, cluster_id=cluster_id) as consumer:
        consumed = [
            ConsumedRecord(record.partition, record.offset, record.value.decode())
            for record in read_all(consumer, TOPIC, 0)
        ]
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert result.ok, result.explanation
    assert result.acknowledged_count >= acknowledged_min


# --- the tests -----------------------------------------------------------------------------


def test_master_killed_mid_produce_a_sync_state_set_member_takes_over(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path, node_count=3) as cluster:
        group = create_topic(cluster)
        before = wait_for_full_set(cluster, group)
        old_master = before.master_id
        assert old_master is not None
        with producing(cluster) as sent:
            wait_for_acknowledged(sent, ACKNOWLEDGED_PER_PHASE, "acks before the kill")
            cluster.kill(old_master)
            after_kill = acknowledged(sent)
            live = [cluster.address(node) for node in cluster.nodes if node != old_master]
            elected = wait_for_new_master(live, cluster.cluster_id, group, old_master)
            wait_for_acknowledged(
                sent, after_kill + ACKNOWLEDGED_PER_PHASE, "acks at the new master"
            )
        assert elected.master_id in before.sync_state_set
        assert elected.master_epoch == before.master_epoch + 1
        check_nothing_lost_or_doubled(live, cluster.cluster_id, sent, 2 * ACKNOWLEDGED_PER_PHASE)


def test_master_paused_mid_produce_rejoins_as_a_slave_with_the_same_log(tmp_path: Path) -> None:
    """A master paused between appending a produce and sending it keeps a tail no one else
    has; resumed, it must cut exactly that at handshake (at the new epoch's start offset).
    Whether the pause lands there is up to the scheduler (slaves paused first would not
    help: the kernel keeps what was sent to them and they read it when resumed), so the
    cut is checked when the old master's log says it made one."""
    with ProcessCluster(tmp_path, node_count=3) as cluster:
        group = create_topic(cluster)
        before = wait_for_full_set(cluster, group)
        old_master = before.master_id
        assert old_master is not None
        live = [cluster.address(node) for node in cluster.nodes if node != old_master]
        with producing(cluster) as sent:
            wait_for_acknowledged(sent, ACKNOWLEDGED_PER_PHASE, "acks before the pause")
            cluster.pause(old_master)
            after_pause = acknowledged(sent)
            elected = wait_for_new_master(live, cluster.cluster_id, group, old_master)
            wait_for_acknowledged(
                sent, after_pause + ACKNOWLEDGED_PER_PHASE, "acks at the new master"
            )
            cluster.resume(old_master)
        new_master = elected.master_id
        assert new_master is not None and new_master in before.sync_state_set
        master_status = wait_until(
            lambda: broker_status(live, cluster.cluster_id, group, new_master),
            WAIT_SECONDS,
            "the new master's status",
        )

        def caught_up() -> BrokerStatus | None:
            status = broker_status(cluster.endpoints, cluster.cluster_id, group, old_master)
            if status is None or status.role != "slave":
                return None
            return status if status.max_offset == master_status.max_offset else None

        rejoined = wait_until(caught_up, WAIT_SECONDS, "the old master to catch up as a slave")
        epochs = [entry.epoch for entry in master_status.epochs]
        assert epochs[-2:] == [before.master_epoch, elected.master_epoch]
        assert rejoined.epochs == master_status.epochs, "the epoch files agree"
        for _, cut_to in truncations(cluster.log_text(old_master)):
            assert cut_to == master_status.epochs[-1].start_offset, "cut at the epoch start"
        check_epochs_command(cluster, group, old_master, elected.master_epoch)
        wait_for_full_set(cluster, group)
        check_nothing_lost_or_doubled(
            cluster.endpoints, cluster.cluster_id, sent, 2 * ACKNOWLEDGED_PER_PHASE
        )


def truncations(log_text: str) -> list[tuple[int, int]]:
    """(from, to) of each handshake truncation a broker logged."""
    pattern = r"handshake truncated the commit log from (\d+) to (\d+)"
    return [(int(found[1]), int(found[2])) for found in re.finditer(pattern, log_text)]


def check_epochs_command(cluster: ProcessCluster, group: str, broker_id: str, epoch: int) -> None:
    """`quorumlog ha epochs GROUP --broker ID -w json` shows the rejoined slave's file."""
    common = ["--endpoints", ",".join(cluster.endpoints), "--cluster-id", cluster.cluster_id]
    shown = CliRunner().invoke(
        cli, ["ha", "epochs", group, "--broker", broker_id, "-w", "json", *common]
    )
    assert shown.exit_code == 0, shown.output
    status = msgspec.json.decode(shown.output, type=BrokerStatus)
    assert status.role == "slave"
    assert status.epochs[-1].epoch == epoch


def test_master_and_controller_leader_killed_together_elect_once(tmp_path: Path) -> None:
    """apache/rocketmq #7689's shape. Three nodes: killing two (the master's and the
    controller leader's) would leave the controller without a majority, so the master is
    first moved (an admin election) to the controller leader's node, and that one node is
    killed. Another node is paused for longer than the broker heartbeat timeout right
    after, so the controller has no majority that long: by its log's clock every broker
    then looks silent, and a new leader that checked at once would elect no one (a
    MasterEpoch spent on nothing) before electing a master."""
    with ProcessCluster(tmp_path, node_count=3) as cluster:
        group = create_topic(cluster)
        wait_for_full_set(cluster, group)
        leader = wait_until(lambda: controller_leader(cluster), WAIT_SECONDS, "a controller leader")
        before = co_locate_master(cluster, group, leader)
        survivor = next(node for node in cluster.nodes if node != leader)
        with producing(cluster) as sent:
            wait_for_acknowledged(sent, ACKNOWLEDGED_PER_PHASE, "acks before the kill")
            cluster.kill(leader)
            cluster.pause(survivor)
            # The length of the fault (the scenario's parameter), not a wait for an outcome.
            time.sleep(CONTROLLER_OUTAGE_SECONDS)
            cluster.resume(survivor)
            after_kill = acknowledged(sent)
            live = [cluster.address(node) for node in cluster.nodes if node != leader]
            elected = wait_for_new_master(live, cluster.cluster_id, group, leader)
            wait_for_acknowledged(
                sent, after_kill + ACKNOWLEDGED_PER_PHASE, "acks at the new master"
            )
        assert controller_leader(cluster) not in (None, leader)
        assert elected.master_id in before.sync_state_set
        assert elected.master_epoch == before.master_epoch + 1, "one election, not two"
        check_nothing_lost_or_doubled(live, cluster.cluster_id, sent, 2 * ACKNOWLEDGED_PER_PHASE)


def co_locate_master(cluster: ProcessCluster, group: str, broker_id: str) -> BrokerGroupInfo:
    """Make `broker_id` the master (if it is not) and wait until it serves as one with all
    three brokers in sync again."""
    info = wait_for_full_set(cluster, group)
    if info.master_id != broker_id:
        with HAControllerClient(cluster.endpoints, cluster_id=cluster.cluster_id) as client:
            client.elect_master(group, broker_id)

    def serving() -> BrokerGroupInfo | None:
        found = group_info(cluster.endpoints, cluster.cluster_id, group)
        if found is None or found.master_id != broker_id or len(found.sync_state_set) != 3:
            return None
        status = broker_status(cluster.endpoints, cluster.cluster_id, group, broker_id)
        return found if status is not None and status.role == "master" else None

    return wait_until(serving, WAIT_SECONDS, f"{broker_id} to serve as master, all in sync")
