"""Stream traffic per topic, for `quorumlog_topic_*` metrics: counted once per produce batch
acknowledged and once per fetch answered, never per record.

The node's stream service calls `produced` and `fetched`; `families` turns the totals into
Prometheus counters at scrape time. The label is the topic (bounded: topics are created by
operators, not per key or per client).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric


class TopicTraffic:
    def __init__(self) -> None:
        self.records_in: dict[str, int] = {}
        self.bytes_in: dict[str, int] = {}
        self.records_out: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}

    def produced(self, topic: str, records: int, size_bytes: int) -> None:
        """A produce batch was acknowledged (not a duplicate of one counted before)."""
        self.records_in[topic] = self.records_in.get(topic, 0) + records
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + size_bytes

    def fetched(self, topic: str, records: int, size_bytes: int) -> None:
        """A fetch was answered with `records` records in `size_bytes` of batches."""
        self.records_out[topic] = self.records_out.get(topic, 0) + records
        self.bytes_out[topic] = self.bytes_out.get(topic, 0) + size_bytes

    def forget(self, topic: str) -> None:
        """The topic was deleted: its series go (a new topic of that name starts at 0)."""
        for totals in (self.records_in, self.bytes_in, self.records_out, self.bytes_out):
            totals.pop(topic, None)

    def families(self) -> Iterator[Metric]:
        for name, text, totals in (
            ("records_in", "Records produced to the topic through this node.", self.records_in),
            (
                "bytes_in",
                "Record bytes (keys and values) produced through this node.",
                self.bytes_in,
            ),
            ("records_out", "Records fetched from the topic through this node.", self.records_out),
            ("bytes_out", "Batch bytes fetched from the topic through this node.", self.bytes_out),
        ):
            family = CounterMetricFamily(f"quorumlog_topic_{name}", text, labels=["topic"])
            for topic, total in sorted(totals.items()):
                family.add_metric([topic], total)
            yield family
