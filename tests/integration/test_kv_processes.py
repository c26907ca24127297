"""The replicated KV on real node processes: crashes, pauses, restarts, snapshots.

Each test starts its own cluster of `quorumlog node` processes (fsync on) on free loopback
ports; see `process_cluster.py`. Waits are conditions with deadlines, never bare sleeps.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from quorumlog.codec.wire import StatusResponse
from quorumlog.errors import ClientError, UnavailableError, UnknownOutcomeError
from quorumlog.kv.client import KVClient
from quorumlog.testing.history import History
from quorumlog.testing.linearizability import KV_MODEL, check_linearizable

from .process_cluster import ProcessCluster, wait_until

WAIT_SECONDS = 15.0


class ClientThread:
    """Runs `step(client, number)` in a loop on its own thread until stopped.

    Any exception other than a client error ends the loop and is raised again by `stop`,
    so a failing worker fails the test instead of vanishing with its thread."""

    def __init__(
        self, client: KVClient, step: Callable[[KVClient, int], None], steps_max: int = 10**9
    ) -> None:
        self.client = client
        self.step = step
        self.steps_max = steps_max
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.steps_done = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> ClientThread:
        self.thread.start()
        return self

    def run(self) -> None:
        try:
            while not self.stopping.is_set() and self.steps_done < self.steps_max:
                self.step(self.client, self.steps_done)
                self.steps_done += 1
        except BaseException as error:  # handed to the test thread by stop()
            self.error = error

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        if self.thread.is_alive():
            raise AssertionError("a client thread did not stop within 30 s")
        if self.error is not None:
            raise self.error


class PutRecorder:
    """Puts key-N = value-N one after another; remembers which were acknowledged."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.acknowledged: dict[str, str] = {}
        self.unknown: dict[str, str] = {}
        self.lock = threading.Lock()

    def __call__(self, client: KVClient, number: int) -> None:
        key, value = f"{self.prefix}-key-{number}", f"{self.prefix}-value-{number}"
        try:
            client.put(key, value)
        except ClientError:
            with self.lock:
                self.unknown[key] = value
            return
        with self.lock:
            self.acknowledged[key] = value

    @property
    def acknowledged_count(self) -> int:
        with self.lock:
            return len(self.acknowledged)


def leader_status(cluster: ProcessCluster, node_id: str) -> StatusResponse:
    status = cluster.status(node_id)
    if status is None:
        raise AssertionError(f"{node_id} does not answer")
    return status


def check_all_readable(client: KVClient, recorder: PutRecorder) -> None:
    """Every acknowledged put is read back; an unknown one reads as its value or absent."""
    for key, value in recorder.acknowledged.items():
        assert client.get(key) == value, f"acknowledged {key}={value} was lost"
    for key, value in recorder.unknown.items():
        assert client.get(key) in (None, value)


def test_leader_sigkilled_during_writes_loses_no_acknowledged_write(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path) as cluster:
        old_leader = cluster.wait_for_leader()
        old_term = leader_status(cluster, old_leader).term
        recorder = PutRecorder("crash")
        writer = ClientThread(cluster.client(timeout=5.0), recorder).start()
        try:
            wait_until(lambda: recorder.acknowledged_count >= 30, WAIT_SECONDS, "30 writes")
            cluster.kill(old_leader)
            acknowledged_at_kill = recorder.acknowledged_count
            new_leader = cluster.wait_for_leader(excluding={old_leader})
            wait_until(
                lambda: recorder.acknowledged_count >= acknowledged_at_kill + 30,
                WAIT_SECONDS,
                "30 writes acknowledged by the new leader",
            )
        finally:
            writer.stop()
        assert leader_status(cluster, new_leader).term > old_term
        check_all_readable(cluster.client(), recorder)


class StatusWatcher:
    """Polls every answering node's status on a thread; remembers who led which term."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self.cluster = cluster
        self.leaders_by_term: dict[int, set[str]] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stopping.is_set():
            for status in self.cluster.statuses().values():
                if status.is_leader:
                    self.leaders_by_term.setdefault(status.term, set()).add(status.node_id)
            self.stopping.wait(0.01)

    def __enter__(self) -> StatusWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exception: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)


class AppendRecorder:
    """Appends "N," to one key, one call at a time; remembers how each call ended."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.acknowledged: list[int] = []
        self.unknown: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, client: KVClient, number: int) -> None:
        try:
            client.append(self.key, f"{number},")
        except UnavailableError:
            return  # certainly not applied
        except ClientError:
            with self.lock:
                self.unknown.append(number)
            return
        with self.lock:
            self.acknowledged.append(number)

    @property
    def acknowledged_count(self) -> int:
        with self.lock:
            return len(self.acknowledged)


def test_sigstopped_leader_steps_down_and_no_term_has_two_leaders(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path) as cluster, StatusWatcher(cluster) as watcher:
        old_leader = cluster.wait_for_leader()
        old_term = leader_status(cluster, old_leader).term
        recorder = AppendRecorder("history")
        writer = ClientThread(cluster.client(timeout=5.0), recorder).start()
        try:
            wait_until(lambda: recorder.acknowledged_count >= 20, WAIT_SECONDS, "20 appends")
            cluster.pause(old_leader)
            new_leader = cluster.wait_for_leader(excluding={old_leader})
            new_term = leader_status(cluster, new_leader).term
            count_at_election = recorder.acknowledged_count
            wait_until(
                lambda: recorder.acknowledged_count >= count_at_election + 20,
                WAIT_SECONDS,
                "20 appends at the new leader",
            )
            cluster.resume(old_leader)

            def old_leader_stepped_down() -> bool:
                status = cluster.status(old_leader)
                return status is not None and not status.is_leader and status.term >= new_term

            wait_until(old_leader_stepped_down, WAIT_SECONDS, f"{old_leader} to step down")
            count_at_resume = recorder.acknowledged_count
            wait_until(
                lambda: recorder.acknowledged_count >= count_at_resume + 10,
                WAIT_SECONDS,
                "10 appends after the old leader came back",
            )
        finally:
            writer.stop()
        assert new_term > old_term
        for term, leaders in watcher.leaders_by_term.items():
            assert len(leaders) == 1, f"term {term} had leaders {sorted(leaders)}"
        final = cluster.client().get("history") or ""
        numbers = [int(part) for part in final.split(",") if part]
        assert len(numbers) == len(set(numbers)), f"an append was applied twice: {numbers}"
        present = set(numbers)
        lost = [number for number in recorder.acknowledged if number not in present]
        assert not lost, f"acknowledged appends lost: {lost}"
        unexpected = present - set(recorder.acknowledged) - set(recorder.unknown)
        assert not unexpected, f"appends applied that failed for sure: {sorted(unexpected)}"
        # One writer, one call at a time: acknowledged appends land in the order called.
        acknowledged_order = [number for number in numbers if number in recorder.acknowledged]
        assert acknowledged_order == sorted(acknowledged_order)


def test_every_node_sigkilled_mid_writes_and_restarted_recovers_state(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path) as cluster:
        cluster.wait_for_leader()
        client = cluster.client()
        expected: dict[str, str] = {}
        for number in range(40):
            client.put(f"key-{number}", f"value-{number}")
            expected[f"key-{number}"] = f"value-{number}"
        for number in range(10):
            client.append("appended", f"{number};")
        expected["appended"] = "".join(f"{number};" for number in range(10))
        client.delete("key-0")
        del expected["key-0"]
        commit_before = max(status.commit_index for status in cluster.statuses().values())
        term_before = max(status.term for status in cluster.statuses().values())

        # The crash lands in the middle of writes: some entries are appended and maybe
        # synced, some answered, some not.
        recorder = PutRecorder("in-flight")
        writer = ClientThread(cluster.client(timeout=1.0), recorder).start()
        try:
            wait_until(lambda: recorder.acknowledged_count >= 20, WAIT_SECONDS, "20 writes")
            for node_id in cluster.nodes:
                cluster.kill(node_id)
        finally:
            writer.stop()
        cluster.restart(*cluster.nodes)
        cluster.wait_for_leader()

        reader = cluster.client()
        for key, value in expected.items():
            assert reader.get(key) == value, f"{key} not recovered"
        check_all_readable(reader, recorder)
        assert reader.get("key-0") is None
        reader.put("after-restart", "yes")
        assert reader.get("after-restart") == "yes"
        statuses = cluster.statuses()
        assert len(statuses) == 3
        assert max(status.term for status in statuses.values()) > term_before
        assert max(status.commit_index for status in statuses.values()) > commit_before


class HistoryClient:
    """One client of a linearizability history: random puts, appends and gets on few keys."""

    def __init__(self, history: History, client_number: int, keys: list[str]) -> None:
        self.history = history
        self.client_number = client_number
        self.keys = keys
        self.random = random.Random(client_number)

    def __call__(self, client: KVClient, number: int) -> None:
        key = self.random.choice(self.keys)
        kind = self.random.choice(("put", "append", "get", "get"))
        argument = None if kind == "get" else f"{self.client_number}.{number};"
        operation_id = self.history.invoke(
            self.client_number, kind, key, argument, time.monotonic_ns()
        )
        output: str | None = None
        try:
            if kind == "get":
                output = client.get(key)
            elif kind == "put":
                client.put(key, argument or "")
            else:
                client.append(key, argument or "")
        except UnavailableError:
            self.history.fail(operation_id, time.monotonic_ns())  # never accepted
        except (UnknownOutcomeError, ClientError, OSError):
            self.history.unknown(operation_id)
        else:
            self.history.complete(operation_id, output, time.monotonic_ns())


def test_concurrent_clients_with_a_leader_kill_stay_linearizable(tmp_path: Path) -> None:
    history = History()
    keys = ["x", "y", "z"]
    with ProcessCluster(tmp_path) as cluster:
        old_leader = cluster.wait_for_leader()
        workers = [
            ClientThread(
                cluster.client(timeout=4.0), HistoryClient(history, number, keys), steps_max=45
            )
            for number in range(4)
        ]
        for worker in workers:
            worker.start()
        try:
            wait_until(lambda: len(history) >= 50, WAIT_SECONDS, "50 operations")
            cluster.kill(old_leader)
            cluster.wait_for_leader(excluding={old_leader})
            wait_until(
                lambda: all(worker.steps_done >= worker.steps_max for worker in workers),
                WAIT_SECONDS * 2,
                "every client to finish its operations",
            )
        finally:
            for worker in workers:
                worker.stop()
    operations = history.operations()
    result = check_linearizable(operations, KV_MODEL)
    assert result.ok is True, result.explanation
    completed = [operation for operation in operations if operation.status.value == "ok"]
    assert len(completed) >= 100, f"only {len(completed)} of {len(operations)} completed"


def log_segment_files(data_dir: Path) -> list[Path]:
    """The segment files (not the meta file, nor the temporary file a meta update writes
    and renames while the node runs)."""
    return [
        path
        for path in (data_dir / "kv" / "log").iterdir()
        if path.name.startswith("log_")
        and path.name != "log_meta"
        and not path.name.endswith(".tmp")
    ]


def test_snapshots_compact_the_log_and_catch_up_a_lagging_node(tmp_path: Path) -> None:
    snapshot_entries = 200
    arguments = ["--snapshot-entries", str(snapshot_entries)]
    with ProcessCluster(tmp_path, extra_arguments=arguments) as cluster:
        leader = cluster.wait_for_leader()
        lagging = next(node_id for node_id in cluster.nodes if node_id != leader)
        cluster.kill(lagging)
        recorders = [PutRecorder(f"w{number}") for number in range(3)]
        writers = [ClientThread(cluster.client(), recorder).start() for recorder in recorders]
        first_indexes: list[int] = []
        spans: list[int] = []

        def compacted_twice() -> bool:
            status = cluster.status(leader)
            if status is None:
                return False
            spans.append(status.last_index - status.first_index)
            if not first_indexes or status.first_index != first_indexes[-1]:
                first_indexes.append(status.first_index)
            return len(first_indexes) >= 3

        try:
            wait_until(compacted_twice, WAIT_SECONDS * 2, "the log to be compacted twice")
        finally:
            for writer in writers:
                writer.stop()
        # Compaction keeps snapshot_entries // 2 entries behind each snapshot; the log
        # never holds much more than a snapshot interval plus that tail plus what is in
        # flight between two polls.
        assert max(spans) < 3 * snapshot_entries, spans
        assert first_indexes == sorted(first_indexes)
        for node_id in cluster.nodes:
            if node_id != lagging:
                # Segments are 64 MiB (the node has no flag for smaller ones), so this load
                # never rolls one; the bound on the log shows in first_index above.
                assert len(log_segment_files(cluster.nodes[node_id].data_dir)) == 1
                snapshots = list((cluster.nodes[node_id].data_dir / "kv" / "snapshots").iterdir())
                assert 1 <= len(snapshots) <= 2, snapshots  # the store keeps the last two

        # The lagging node's log ends before the leader's first index: only a snapshot
        # can bring it up to date.
        leader_commit = leader_status(cluster, leader).commit_index
        cluster.restart(lagging)
        wait_until(
            lambda: (status := cluster.status(lagging)) and status.applied_index >= leader_commit,
            WAIT_SECONDS,
            f"{lagging} to catch up through a snapshot",
        )
        lagging_status = leader_status(cluster, lagging)
        assert lagging_status.first_index > 1
        with KVClient([cluster.address(lagging)], cluster_id=cluster.cluster_id) as local:
            for recorder in recorders:
                for key, value in list(recorder.acknowledged.items())[:20]:
                    assert local.get(key, stale=True) == value
