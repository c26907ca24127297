"""Metrics, health, events and the dashboard on real node processes (issue 14).

One three-node cluster serves the whole module (each node with `--http-listen` on a port
the OS picks, read back from its log, and `--log-format json`). The tests run in order
and each leaves the cluster as the next expects: healthy → the KV leader killed (the
browser test watches one dashboard page through it, when Chromium is there; the metrics
test checks `has_leader` and `leader_changes_seen_total` on the survivors) → a second
node killed, leaving a minority node whose `/health` says 503.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from quorumlog.stream.client_admin import Admin
from quorumlog.stream.consumer import Consumer
from quorumlog.stream.producer import Producer
from tests.integration.headless_browser import HeadlessBrowser, find_chromium
from tests.integration.process_cluster import ProcessCluster, wait_until

HTTP_TIMEOUT_SECONDS = 5.0
ELECTION_TIMEOUT_SECONDS = 30.0
"""Generous: eight engineers share two cores; every wait is on a condition."""
HTTP_LINE = re.compile(r"serves metrics and its dashboard at http://(\S+?)/")


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_SECONDS) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class ObservedCluster:
    def __init__(self, cluster: ProcessCluster) -> None:
        self.cluster = cluster
        self.http: dict[str, str] = {}
        self.killed_leader: str | None = None
        self.changes_before_kill: dict[str, float] = {}

    def http_address(self, node_id: str) -> str:
        if node_id not in self.http:
            found = wait_until(
                lambda: HTTP_LINE.search(self.cluster.log_text(node_id)),
                ELECTION_TIMEOUT_SECONDS,
                f"{node_id} to log its HTTP address",
            )
            self.http[node_id] = found.group(1)
        return self.http[node_id]

    def url(self, node_id: str, path: str) -> str:
        return f"http://{self.http_address(node_id)}{path}"

    def metrics(self, node_id: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = http_get(self.url(node_id, "/metrics"))
        assert status == 200
        samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def metric(self, node_id: str, name: str, group: str = "kv") -> float | None:
        return self.metrics(node_id).get((name, (("group", group),)))

    def kv_leader(self) -> str | None:
        """The node whose metrics say it leads the KV group (None: none does now)."""
        alive = [node_id for node_id, node in self.cluster.nodes.items() if node.running]
        leaders = [n for n in alive if self.metric(n, "quorumlog_server_is_leader") == 1]
        return leaders[0] if len(leaders) == 1 else None

    def survivors(self) -> list[str]:
        return sorted(n for n, node in self.cluster.nodes.items() if node.running)

    def kill_kv_leader_once(self) -> str:
        """Kill the KV leader (once for the module), noting each survivor's leader
        changes seen just before."""
        if self.killed_leader is None:
            leader = wait_until(self.kv_leader, ELECTION_TIMEOUT_SECONDS, "a KV leader")
            for node_id in self.survivors():
                if node_id != leader:
                    seen = self.metric(node_id, "quorumlog_server_leader_changes_seen_total")
                    self.changes_before_kill[node_id] = seen or 0.0
            self.cluster.kill(leader)
            self.killed_leader = leader
        return self.killed_leader


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObservedCluster]:
    base: Path = tmp_path_factory.mktemp("observability")
    with ProcessCluster(
        base,
        node_count=3,
        extra_arguments=["--http-listen", "127.0.0.1:0", "--log-format", "json"],
    ) as cluster:
        yield ObservedCluster(cluster)


def test_a_healthy_cluster_reports_one_leader_and_health(observed: ObservedCluster) -> None:
    leader = wait_until(observed.kv_leader, ELECTION_TIMEOUT_SECONDS, "a KV leader")
    for node_id in observed.survivors():
        # A follower knows the leader from its first message: a moment after the election.
        wait_until(
            lambda node_id=node_id: observed.metric(node_id, "quorumlog_server_has_leader") == 1,
            ELECTION_TIMEOUT_SECONDS,
            f"{node_id} to know the KV leader",
        )
        wait_until(
            lambda node_id=node_id: http_get(observed.url(node_id, "/health"))[0] == 200,
            ELECTION_TIMEOUT_SECONDS,
            f"{node_id}'s /health to say 200",
        )
        status, body = http_get(observed.url(node_id, "/health"))
        assert (status, json.loads(body)) == (200, {"health": "true"})
        assert http_get(observed.url(node_id, "/livez"))[0] == 200
        assert http_get(observed.url(node_id, "/nowhere"))[0] == 404
    samples = observed.metrics(leader)
    assert samples[("quorumlog_server_proposals_committed_total", (("group", "kv"),))] >= 1
    assert ("quorumlog_disk_wal_fsync_duration_seconds_count", ()) in samples
    assert any(name == "quorumlog_network_peer_sent_bytes_total" for name, _ in samples)
    assert samples[("quorumlog_bookie_writable", ())] in (0, 1)
    follower = next(node_id for node_id in observed.survivors() if node_id != leader)
    wait_until(
        lambda: observed.metrics(leader).get(
            ("quorumlog_network_peer_round_trip_time_seconds_count", (("peer", follower),))
        ),
        ELECTION_TIMEOUT_SECONDS,
        f"a round trip to {follower} measured",
    )
    assert ("quorumlog_bookie_journal_syncs_total", ()) in samples


def test_topic_traffic_and_consumer_lag_are_metrics_and_on_the_dashboard(
    observed: ObservedCluster,
) -> None:
    cluster = observed.cluster
    endpoints, cluster_id = cluster.endpoints, cluster.cluster_id
    with Admin(endpoints, cluster_id=cluster_id) as admin:
        admin.create_topic("clicks", partitions=1, replication=3)
    with Producer(endpoints, cluster_id=cluster_id) as producer:
        for number in range(10):
            producer.send("clicks", b"click-%d" % number, partition=0)
        producer.flush()
    with Consumer(endpoints, cluster_id=cluster_id, group="reports") as consumer:
        records = consumer.read("clicks", 0, 0, max_records=100)
        assert len(records) == 10
        consumer.commit("clicks", 0, 4)
    with Admin(endpoints, cluster_id=cluster_id) as admin:
        # Elected by now: the produce went through it (no election since on a quiet cluster).
        leader = admin.describe_topic("clicks").partitions[0].leader
    assert leader is not None
    topic = (("topic", "clicks"),)
    samples = observed.metrics(leader)
    assert samples[("quorumlog_topic_records_in_total", topic)] == 10
    assert samples[("quorumlog_topic_bytes_in_total", topic)] == sum(
        len(b"click-%d" % number) for number in range(10)
    )
    assert samples[("quorumlog_topic_records_out_total", topic)] == 10
    lag_labels = (("consumer_group", "reports"), ("partition", "0"), ("topic", "clicks"))
    wait_until(
        lambda: observed.metrics(leader).get(("quorumlog_consumer_group_lag", lag_labels)) == 6,
        ELECTION_TIMEOUT_SECONDS,
        "the consumer group's lag of 6 on the partition leader",
    )
    status, body = http_get(observed.url(leader, "/api/status"))
    shown = json.loads(body)
    assert status == 200
    assert [t["name"] for t in shown["topics"]] == ["clicks"]
    assert shown["topics"][0]["partitions"][0]["end_offset"] == 10
    assert shown["consumer_groups"][0]["group"] == "reports"
    assert shown["consumer_groups"][0]["partitions"][0]["lag"] == 6


def test_an_ha_topic_s_master_reports_its_confirm_offset_lag(observed: ObservedCluster) -> None:
    cluster = observed.cluster
    endpoints, cluster_id = cluster.endpoints, cluster.cluster_id
    with Admin(endpoints, cluster_id=cluster_id) as admin:
        admin.create_topic("audit", 1, 3, storage="ha")
    with Producer(endpoints, cluster_id=cluster_id) as producer:
        for number in range(5):
            producer.send("audit", b"entry-%d" % number, partition=0)
        producer.flush()
    series = ("quorumlog_ha_confirm_offset_lag_bytes", (("partition", "0"), ("topic", "audit")))

    def masters_reporting() -> list[float] | None:
        values = [observed.metrics(node_id).get(series) for node_id in observed.survivors()]
        reported = [value for value in values if value is not None]
        # Acknowledged produces are confirmed: the one master's lag comes back to 0.
        return reported if reported == [0.0] else None

    wait_until(masters_reporting, ELECTION_TIMEOUT_SECONDS, "one HA master reporting no lag")


def test_the_dashboard_page_shows_members_and_follows_a_leader_change(
    observed: ObservedCluster, tmp_path: Path
) -> None:
    if find_chromium() is None:
        pytest.skip("no chromium binary (apt-get install chromium) to run the dashboard in")
    leader = wait_until(observed.kv_leader, ELECTION_TIMEOUT_SECONDS, "a KV leader")
    watcher = next(node_id for node_id in observed.survivors() if node_id != leader)
    with HeadlessBrowser.launch(tmp_path / "profile") as browser:
        page = browser.open(observed.url(watcher, "/"))

        def shown_leader() -> Any:
            # Null until the page has loaded (the target opens before its document).
            return page.evaluate("document.getElementById('kv-leader')?.textContent ?? null")

        wait_until(lambda: shown_leader() == leader, ELECTION_TIMEOUT_SECONDS, "the leader shown")
        members = page.evaluate(
            "[...document.querySelectorAll('#members tr')].map(r => r.dataset.member)"
        )
        assert members == ["n1", "n2", "n3"]
        refreshes_before = int(page.evaluate("document.getElementById('refreshes').textContent"))
        killed = observed.kill_kv_leader_once()
        assert killed == leader
        new_leader = wait_until(
            lambda: (shown := shown_leader()) not in (leader, "none", "…") and shown,
            ELECTION_TIMEOUT_SECONDS,
            "the page to show a new leader",
        )
        assert new_leader in observed.survivors()
        # The same page re-rendered (it was not reloaded: its refresh count went on).
        refreshes = int(page.evaluate("document.getElementById('refreshes').textContent"))
        assert refreshes > refreshes_before
        events = page.evaluate(
            "[...document.querySelectorAll('#events tr')].map(r => r.cells[1].textContent)"
        )
        assert "leader changed" in events


def test_a_killed_leader_shows_in_has_leader_and_leader_changes(observed: ObservedCluster) -> None:
    killed = observed.kill_kv_leader_once()
    survivors = observed.survivors()
    assert killed not in survivors and len(survivors) == 2
    new_leader = wait_until(observed.kv_leader, ELECTION_TIMEOUT_SECONDS, "a new KV leader")
    assert new_leader != killed
    for node_id in survivors:
        wait_until(
            lambda node_id=node_id: (
                observed.metric(node_id, "quorumlog_server_leader_changes_seen_total")
                > observed.changes_before_kill[node_id]
            ),
            ELECTION_TIMEOUT_SECONDS,
            f"{node_id} to count the leader change",
        )
        assert observed.metric(node_id, "quorumlog_server_has_leader") == 1
    # The JSON log: one object per line, and the election with its group and term.
    lines = observed.cluster.log_text(new_leader).splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(records) == len([line for line in lines if line.strip()])
    elected = [r for r in records if r.get("kind") == "became_leader" and r["group"] == "kv"]
    assert elected and elected[-1]["term"] >= 2 and elected[-1]["node"] == new_leader
    assert all(isinstance(r["index"], int) for r in elected)


def test_a_minority_node_has_no_leader_and_is_unhealthy(observed: ObservedCluster) -> None:
    observed.kill_kv_leader_once()
    first, last = observed.survivors()
    observed.cluster.kill(first)
    wait_until(
        lambda: observed.metric(last, "quorumlog_server_has_leader") == 0,
        ELECTION_TIMEOUT_SECONDS,
        f"{last} to see no KV leader",
    )
    status, body = http_get(observed.url(last, "/health"))
    answer = json.loads(body)
    assert status == 503 and answer["health"] == "false"
    assert "no leader" in answer["reason"]
    # Alive all the same: nothing on the node failed.
    assert http_get(observed.url(last, "/livez"))[0] == 200
