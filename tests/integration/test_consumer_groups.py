"""Consumer groups on real node processes (one 3-node cluster for the module): two members
split three partitions; one member's process is SIGKILLed and the other gets all three
within the session timeout; no committed offset ever goes back while records flow and
members come and go; a commit from a member removed for silence raises CommitFailedError;
and the group commands answer on the live cluster.

The second member runs in its own process (`MEMBER_SCRIPT`), printing its assignment as
one JSON line whenever it changes, so the test can kill it as a crash would.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from quorumlog import Admin, Consumer, Producer
from quorumlog.cli.main import cli
from quorumlog.errors import ClientError, CommitFailedError
from quorumlog.stream.group_admin import GroupAdmin

from .process_cluster import ProcessCluster, _die_with_parent, wait_until

WAIT_SECONDS = 30.0
TOPIC = "rebalanced"
GROUP = "workers"
SESSION_TIMEOUT_MS = 2_000
HEARTBEAT_SECONDS = 0.2
REASSIGNMENT_SLACK_SECONDS = 4.0
"""Beyond the session timeout: the coordinator's check and the survivor's next heartbeat
take a few hundred ms; the rest is for a machine shared with other test runs."""
ALL_PARTITIONS = {(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)}

MEMBER_SCRIPT = """
import json, sys
from quorumlog import Consumer
from quorumlog.errors import CommitFailedError
endpoints, cluster_id, group, topic = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
consumer = Consumer(
    endpoints, group=group, cluster_id=cluster_id, auto_offset_reset="earliest",
    session_timeout_ms=int(sys.argv[5]), heartbeat_interval_seconds=float(sys.argv[6]),
    enable_auto_commit=False,
)
consumer.subscribe([topic])
seen = None
while True:
    consumer.poll(0.2)
    try:
        consumer.commit()
    except CommitFailedError:
        pass  # a rebalance took a partition away meanwhile: its new owner reads on
    assignment = sorted(consumer.assignment())
    if assignment != seen:
        seen = assignment
        print(json.dumps(assignment), flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path_factory.mktemp("groups"), node_count=3) as running:
        running.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        yield running


class MemberProcess:
    """A group member in a process of its own; its assignments arrive on a queue."""

    def __init__(self, cluster: ProcessCluster) -> None:
        arguments = [
            ",".join(cluster.endpoints),
            cluster.cluster_id,
            GROUP,
            TOPIC,
            str(SESSION_TIMEOUT_MS),
            str(HEARTBEAT_SECONDS),
        ]
        self.process = subprocess.Popen(
            [sys.executable, "-c", MEMBER_SCRIPT, *arguments],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ),
            preexec_fn=_die_with_parent,
        )
        self.assignments: queue.Queue[set[tuple[str, int]]] = queue.Queue()
        self.latest: set[tuple[str, int]] = set()
        threading.Thread(target=self.read_lines, daemon=True).start()

    def read_lines(self) -> None:
        assert self.process.stdout is not None
        with contextlib.suppress(ValueError):  # the pipe was closed after a kill
            for line in self.process.stdout:
                self.assignments.put({(topic, partition) for topic, partition in json.loads(line)})

    def assignment(self) -> set[tuple[str, int]]:
        while not self.assignments.empty():
            self.latest = self.assignments.get_nowait()
        return self.latest

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class OffsetWatch:
    """Reads the group's committed offsets over and over; remembers any that went back."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self.admin = GroupAdmin(cluster.endpoints, cluster_id=cluster.cluster_id)
        self.highest: dict[tuple[str, int], int] = {}
        self.backwards: list[str] = []
        self.reads = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self) -> None:
        while not self.stopping.is_set():
            try:
                description = self.admin.describe_group(GROUP)
            except ClientError:
                continue  # no group yet, or no coordinator leader for a moment
            self.reads += 1
            for row in description.partitions:
                key = (row.topic, row.partition)
                if row.committed_offset is None:
                    continue
                if row.committed_offset < self.highest.get(key, 0):
                    self.backwards.append(f"{key}: {self.highest[key]} -> {row.committed_offset}")
                self.highest[key] = max(self.highest.get(key, 0), row.committed_offset)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.admin.close()


class Feed:
    """Produces to every partition until stopped, so members always have records."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self.producer = Producer(cluster.endpoints, cluster_id=cluster.cluster_id, linger_ms=5)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.feed, daemon=True)
        self.thread.start()

    def feed(self) -> None:
        number = 0
        while not self.stopping.wait(0.01):  # a steady trickle, not a flood
            for partition in range(3):
                self.producer.send(TOPIC, str(number).encode(), partition=partition)
                number += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.producer.close()


def member(cluster: ProcessCluster, **settings: float) -> Consumer:
    options: dict[str, float] = {
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_seconds": HEARTBEAT_SECONDS,
    }
    options.update(settings)
    return Consumer(
        cluster.endpoints,
        group=GROUP,
        cluster_id=cluster.cluster_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=int(options["session_timeout_ms"]),
        heartbeat_interval_seconds=options["heartbeat_interval_seconds"],
    )


def poll_and_commit(consumer: Consumer) -> set[tuple[str, int]]:
    """One poll and commit; the assignment after them."""
    consumer.poll(0.1)
    # A rebalance may take a partition away between poll and commit: its new owner reads on.
    with contextlib.suppress(CommitFailedError):
        consumer.commit()
    return consumer.assignment()


def poll_until(consumer: Consumer, wanted: set[tuple[str, int]], what: str) -> float:
    """Poll (and commit) until `consumer` is assigned exactly `wanted`; seconds it took."""
    started = time.monotonic()

    def assigned() -> bool:
        return poll_and_commit(consumer) == wanted

    wait_until(assigned, WAIT_SECONDS, what, interval_seconds=0.0)
    return time.monotonic() - started


def test_members_split_partitions_a_killed_one_is_replaced_and_commits_never_go_back(
    cluster: ProcessCluster,
) -> None:
    with Admin(cluster.endpoints, cluster_id=cluster.cluster_id) as admin:
        admin.create_topic(TOPIC, partitions=3, replication=3)
    feed = Feed(cluster)
    watch = OffsetWatch(cluster)
    survivor = member(cluster)
    other = MemberProcess(cluster)
    try:
        survivor.subscribe([TOPIC])

        def split() -> bool:
            mine, theirs = poll_and_commit(survivor), other.assignment()
            return bool(mine) and bool(theirs) and mine | theirs == ALL_PARTITIONS

        wait_until(split, WAIT_SECONDS, "two members splitting three partitions", 0.0)
        assert not survivor.assignment() & other.assignment()
        killed_at = time.monotonic()
        other.kill()
        elapsed = poll_until(survivor, ALL_PARTITIONS, "the survivor owning all partitions")
        print(f"reassigned {time.monotonic() - killed_at:.2f}s after the kill")
        assert elapsed < SESSION_TIMEOUT_MS / 1000 + REASSIGNMENT_SLACK_SECONDS
        # The survivor reads on from the dead member's last commits.
        before = dict(watch.highest)

        def moved_on() -> bool:
            poll_and_commit(survivor)
            return all(watch.highest.get(key, 0) > before.get(key, 0) for key in ALL_PARTITIONS)

        wait_until(moved_on, WAIT_SECONDS, "the survivor committing in every partition", 0.0)
        fenced_commit_is_refused(cluster, survivor, watch)
    finally:
        other.kill()
        survivor.close()
        feed.stop()
        watch.stop()
    assert watch.reads > 0
    assert watch.backwards == [], watch.backwards


def fenced_commit_is_refused(
    cluster: ProcessCluster, survivor: Consumer, watch: OffsetWatch
) -> None:
    """A member that stops heartbeating (its interval far past its session timeout) is
    removed; its commit afterwards is refused and moves no offset."""
    silent = member(cluster, session_timeout_ms=1_000, heartbeat_interval_seconds=60.0)
    try:
        silent.subscribe([TOPIC])

        def given_one() -> bool:
            # The survivor gives the partition up as it polls; then the new member has it.
            poll_and_commit(survivor)
            return bool(silent.assignment())

        wait_until(given_one, WAIT_SECONDS, "the new member getting a partition", 0.0)
        owned = silent.assignment()
        silent.poll(0.5)
        silent.seek(*sorted(owned)[0], 0)  # a commit that would move the offset back

        def removed() -> bool:
            return poll_and_commit(survivor) == ALL_PARTITIONS

        wait_until(removed, WAIT_SECONDS, "the silent member's removal", interval_seconds=0.0)
        with pytest.raises(CommitFailedError, match="unknown_member"):
            silent.commit()
    finally:
        silent.close()
    assert watch.highest[sorted(owned)[0]] > 0


def invoke(arguments: list[str], exit_code: int = 0) -> str:
    result = CliRunner().invoke(cli, arguments)
    assert result.exit_code == exit_code, f"{result.output}{result.exception}"
    return result.output + (str(result.exception) if exit_code == 1 else "")


def test_group_commands_on_the_live_cluster(cluster: ProcessCluster) -> None:
    common = ["--endpoints", ",".join(cluster.endpoints), "--cluster-id", cluster.cluster_id]
    with Admin(cluster.endpoints, cluster_id=cluster.cluster_id) as admin:
        admin.create_topic("audited", partitions=2, replication=3)
    with Producer(cluster.endpoints, cluster_id=cluster.cluster_id) as producer:
        for number in range(10):
            producer.send("audited", str(number).encode(), partition=number % 2)
    consume = ["consume", "audited", "--group", "audit", "--offset", "earliest"]
    printed = invoke([*consume, "--max-messages", "6", "--timeout-ms", "3000", *common])
    assert len(printed.split()) == 6
    listed = json.loads(invoke(["group", "list", "-w", "json", *common]))
    audit = next(group for group in listed if group["group"] == "audit")
    assert (audit["state"], audit["members"]) == ("Empty", 0)
    described = json.loads(invoke(["group", "describe", "audit", "-w", "json", *common]))
    assert sum(row["lag"] for row in described["partitions"]) == 4
    assert {row["end_offset"] for row in described["partitions"]} == {5}
    with Consumer(cluster.endpoints, group="audit", cluster_id=cluster.cluster_id) as live:
        live.subscribe(["audited"])
        reset = ["group", "reset-offsets", "audit", "--topic", "audited", *common]
        assert "live members" in invoke([*reset, "--to-earliest"], exit_code=1)
        assert "live members" in invoke(["group", "delete", "audit", *common], exit_code=1)
    assert invoke([*reset, "--to-earliest"]).splitlines() == [
        "audit\taudited\t0\t0",
        "audit\taudited\t1\t0",
    ]
    again = invoke([*consume, "--timeout-ms", "1500", *common])
    assert sorted(again.split(), key=int) == [str(number) for number in range(10)]
    assert invoke(["group", "delete", "audit", *common]) == "deleted group audit\n"
