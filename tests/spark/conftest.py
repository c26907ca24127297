"""One SparkSession per test process (each xdist worker gets its own), local mode, small.

Spark tests need Java 17 and the `spark` extra; they run in CI like every other test.
`local[2,2]`: two task threads, and two attempts per task (plain `local[2]` never retries
a task, and the sink's exactly-once tests need a retry; each failed attempt costs a fresh
Python worker, so no more than that).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import quorumlog.spark
from tests.spark.fake_stream_cluster import FakeStreamCluster

SPARK_TEST_DIRECTORY = Path(__file__).parent

# Spark and py4j warn in ways we cannot fix here: py4j leaves sockets to the garbage
# collector (ResourceWarning), PySpark warns about pandas >= 3, and py4j / PySpark use
# APIs that newer Pythons deprecate. Only Spark tests get these filters.
SPARK_WARNING_FILTERS = (
    "ignore::ResourceWarning",
    "ignore:PySpark does not yet fully support pandas:FutureWarning",
    "ignore::DeprecationWarning:py4j.*",
    "ignore::DeprecationWarning:pyspark.*",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SPARK_TEST_DIRECTORY in Path(str(item.fspath)).parents:
            for warning_filter in SPARK_WARNING_FILTERS:
                item.add_marker(pytest.mark.filterwarnings(warning_filter))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Python workers must run this interpreter (the virtualenv with quorumlog installed),
    # not whatever `python3` is first on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    scratch = tempfile.mkdtemp(prefix="quorumlog-spark-")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName(f"quorumlog-tests-{worker}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.warehouse.dir", os.path.join(scratch, "warehouse"))
        .config("spark.local.dir", os.path.join(scratch, "local"))
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    quorumlog.spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def fake_cluster() -> Iterator[FakeStreamCluster]:
    cluster = FakeStreamCluster().start()
    yield cluster
    cluster.stop()
