"""The `quorumlog` format on a real Spark cluster, not `local[*]`: a standalone master and
two workers (separate JVMs), executors in their own processes reading a topic's offset
ranges side by side, and the sink writing from them exactly once through a task retry,
against three real node processes.

Skips, saying why, where the cluster cannot start (no Java, no launcher in the pyspark
package). Bounded: every wait has a deadline; the daemons are stopped at the end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog import Admin, Producer
from tests.integration.process_cluster import ProcessCluster, wait_until
from tests.spark.helpers import read_topic, unique_topic
from tests.spark.standalone_cluster import CannotStart, SparkStandalone

pytestmark = pytest.mark.slow

CLUSTER_ID = "integration"
WAIT_SECONDS = 60.0
DRIVER_SECONDS_MAX = 420.0
RECORDS = 4000
VALUE_BYTES = 4096
REPOSITORY = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    try:
        with SparkStandalone(tmp_path_factory.mktemp("spark-standalone"), workers=2) as cluster:
            yield cluster
    except CannotStart as reason:
        pytest.skip(f"a Spark standalone cluster cannot start here: {reason}")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    with ProcessCluster(tmp_path_factory.mktemp("standalone-nodes"), node_count=3) as running:
        running.wait_for_leader(timeout_seconds=WAIT_SECONDS)
        yield running


def test_executors_read_in_parallel_and_the_sink_writes_once(
    standalone: SparkStandalone, nodes: ProcessCluster, tmp_path: Path
) -> None:
    source, sink = unique_topic("standalone-in"), unique_topic("standalone-out")
    values = [b"%06d" % number + b"x" * (VALUE_BYTES - 6) for number in range(RECORDS)]
    with Admin(nodes.endpoints, cluster_id=CLUSTER_ID, timeout=WAIT_SECONDS) as admin:
        admin.create_topic(source, partitions=2)
        admin.create_topic(sink, partitions=4)  # one per read range: see standalone_job
        for topic, partitions in ((source, 2), (sink, 4)):
            for partition in range(partitions):
                wait_until(
                    lambda t=topic, p=partition: admin.describe_topic(t).partitions[p].leader,
                    WAIT_SECONDS,
                    f"a leader of {topic}/{partition}",
                )
    with Producer(nodes.endpoints, cluster_id=CLUSTER_ID, timeout=WAIT_SECONDS) as producer:
        for number, value in enumerate(values):
            producer.send(source, value, partition=number % 2)
        producer.flush()

    driver = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.spark.standalone_job",
            standalone.master_url,
            ",".join(nodes.endpoints),
            CLUSTER_ID,
            source,
            sink,
            str(tmp_path / "failed-once"),
        ],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=DRIVER_SECONDS_MAX,
        env=standalone.environment(),
    )
    assert driver.returncode == 0, driver.stderr[-4000:]
    seen = json.loads(driver.stdout.strip().splitlines()[-1])
    assert seen["executors"] == 2
    assert seen["read_partitions"] == 4 and seen["rows_read"] == RECORDS
    # The ranges were read by both executors' Python daemons, not in the driver.
    assert len(seen["daemons"]) == 2 and seen["driver_pid"] not in seen["daemons"]
    # The failed attempt had written records; its retry sent them again; each is kept once.
    assert seen["stored_before_failure"] > 0
    stored = read_topic(",".join(nodes.endpoints), sink, CLUSTER_ID)
    numbers = sorted(int(record.value[:6]) for records in stored.values() for record in records)
    assert numbers == list(range(RECORDS))
