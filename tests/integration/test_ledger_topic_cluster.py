"""Ledger-backed topics on real node processes (fsync on), each node hosting a bookie:
`quorumlog topic create --storage ledger` then `produce`/`consume` unchanged; and the
queue checker over a run in which the partition's owner is SIGKILLed mid-produce (another
node takes the stale lease over, recovers and closes the last ledger, fencing the dead
owner's, and producing goes on)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path

from click.testing import CliRunner

from quorumlog import Admin, Consumer, Producer
from quorumlog.cli.main import cli
from quorumlog.stream.records import RecordMetadata
from quorumlog.testing.queue_checker import ConsumedRecord, check_queue

from .process_cluster import ProcessCluster, wait_until
from .test_stream_cluster import acknowledged, outcome, read_all, wait_for_partition_leader

WAIT_SECONDS = 20.0
LEDGER_NODE_ARGUMENTS = (
    "--ledger-owner-renew-ms",
    "200",
    "--ledger-owner-stale-ms",
    "1500",
    "--ledger-rollover-records",
    "500",
)


def test_cli_creates_a_ledger_topic_and_produce_consume_work_unchanged(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path, node_count=3, extra_arguments=LEDGER_NODE_ARGUMENTS) as cluster:
        cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        runner = CliRunner()
        common = ["--endpoints", ",".join(cluster.endpoints), "--cluster-id", cluster.cluster_id]
        created = runner.invoke(
            cli,
            [
                *("topic", "create", "lines", "--storage", "ledger", "--ensemble", "3"),
                *("--write-quorum", "2", "--ack-quorum", "2", *common),
            ],
        )
        assert created.exit_code == 0, created.output
        produced = runner.invoke(
            cli, ["produce", "lines", "--key-separator", ":", *common], input="a:one\nb:two\n"
        )
        assert produced.exit_code == 0, produced.output
        consumed = runner.invoke(
            cli,
            [
                *("consume", "lines", "--from-beginning", "--max-messages", "2"),
                *("--print-key", "--print-offset", *common),
            ],
        )
        assert consumed.exit_code == 0, consumed.output
        assert consumed.output.splitlines() == ["Offset:0\ta\tone", "Offset:1\tb\ttwo"]
        described = runner.invoke(cli, ["topic", "describe", "lines", *common])
        assert described.exit_code == 0, described.output
        assert "Storage: ledger\tEnsemble: 3\tWriteQuorum: 2\tAckQuorum: 2" in described.output
        assert "EndOffset: 2" in described.output


def test_ledger_topic_owner_killed_mid_produce_loses_and_doubles_nothing(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path, node_count=3, extra_arguments=LEDGER_NODE_ARGUMENTS) as cluster:
        cluster.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        cluster_id = cluster.cluster_id
        with Admin(cluster.endpoints, cluster_id=cluster_id) as admin:
            # E=2 on 3 bookies: after the kill two bookies are left to write to.
            admin.create_topic(
                "queue", 1, 3, storage="ledger", ensemble=2, write_quorum=2, ack_quorum=2
            )
            owner = wait_for_partition_leader(admin, "queue", 0)
        sent: list[tuple[str, Future[RecordMetadata]]] = []
        stop = threading.Event()
        with Producer(cluster.endpoints, cluster_id=cluster_id, linger_ms=1) as producer:

            def produce_until_stopped() -> None:
                number = 0
                while not stop.is_set():
                    value = f"value-{number}"
                    sent.append((value, producer.send("queue", value.encode())))
                    number += 1
                    if number % 50 == 0:
                        sent[-1][1].exception(timeout=WAIT_SECONDS * 2)

            worker = threading.Thread(target=produce_until_stopped, daemon=True)
            worker.start()
            try:
                wait_until(lambda: acknowledged(sent) >= 2000, WAIT_SECONDS, "2000 acks")
                cluster.kill(owner)
                after_kill = acknowledged(sent)
                wait_until(
                    lambda: acknowledged(sent) >= after_kill + 2000,
                    WAIT_SECONDS * 2,
                    "2000 more acks after the owner was killed",
                )
            finally:
                stop.set()
                worker.join(timeout=WAIT_SECONDS)
            producer.flush()
        produced = [outcome(value, future) for value, future in sent]
        live = [cluster.address(node) for node in cluster.nodes if node != owner]
        with Admin(live, cluster_id=cluster_id) as admin:
            new_owner = admin.describe_topic("queue").partitions[0].leader
        with Consumer(live, cluster_id=cluster_id) as consumer:
            consumed = [
                ConsumedRecord(record.partition, record.offset, record.value.decode())
                for record in read_all(consumer, "queue", 0)
            ]
    assert new_owner not in (None, owner), new_owner
    result = check_queue(produced, consumed, all_acknowledged_read=True)
    assert result.ok, result.explanation
    assert result.acknowledged_count >= 4000
