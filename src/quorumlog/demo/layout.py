"""What the demo creates, and where: its topics, their shapes, its files under --dir."""

from __future__ import annotations

TOPIC = "flights"
"""The input: one record per flight, keyed by carrier."""
OUTPUT_TOPIC = "flight-stats"
"""The results: one record per changed (carrier, month) group and micro-batch."""
AIRLINES_TOPIC = "airlines"
"""The carrier names the job joins with: key = carrier code, value = name."""
PARTITIONS = 3
REPLICATION = 3
KILLED_PARTITION = 0
"""The partition whose leader the demo kills half way through producing."""
CLUSTER_DIRECTORY = "cluster"
SPARK_LOG_FILE = "spark.log"
SPARK_CHECKPOINT_DIRECTORY = "spark-checkpoint"
