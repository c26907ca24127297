"""A failed sync at a broker (EIO, a full disk) does not leave produces hanging.

The kernel may have dropped what a failed sync was writing, so the broker's log counts
nothing more durable until it is reopened. Before this, the broker kept its role and its
waiting produces until a restart. Now it steps out (ha/broker_host.py `step_out`): the
waiting produces fail with `HASyncFailedError` (an unknown outcome), new ones are refused
with it, and the broker falls silent, so the controller elects a master from the SyncStateSet
(a failed master) or the master shrinks it out of the set (a failed slave).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from pathlib import Path

from quorumlog.errors import (
    DiskFullError,
    HASyncFailedError,
    MasterFencedError,
    StorageError,
    UnknownOutcomeError,
)
from quorumlog.storage.files import storage_error

from .broker_harness import GROUP, BrokerCluster
from .test_broker_host import BROKERS, produce, started

Job = Callable[[], None]
Done = Callable[[BaseException | None], None]


class FailingSyncs:
    """A `Background` whose next sync fails as the disk says (the job does not run: nothing
    it would have flushed is durable), then runs every later job at once."""

    def __init__(self, error: StorageError) -> None:
        self.error: StorageError | None = error

    def submit(self, job: Job, done: Done) -> None:
        error, self.error = self.error, None
        if error is not None:
            done(error)
            return
        job()
        done(None)


def io_error() -> StorageError:
    return storage_error(Path("/b/log/00000000"), OSError(errno.EIO, "Input/output error"))


def acknowledged(cluster: BrokerCluster, broker_id: str, count: int) -> list[bytes]:
    messages = [f"a{number}".encode() for number in range(count)]
    done = [cluster.host(broker_id).produce([message]) for message in messages]
    cluster.run_until(lambda: all(completion.done() for completion in done))
    assert all(completion.exception() is None for completion in done)
    return messages


def test_a_failed_master_sync_fails_waiting_produces_and_a_member_takes_over(
    tmp_path: Path,
) -> None:
    cluster = started(tmp_path)
    before = acknowledged(cluster, "b1", 5)
    cluster.host("b1").background = FailingSyncs(io_error())
    waiting = produce(cluster, "b1", b"in-flight")
    cluster.run_until(waiting.done, seconds_max=1.0)  # hung until a restart before
    failure = waiting.exception()
    assert isinstance(failure, HASyncFailedError)
    assert isinstance(failure, UnknownOutcomeError)  # it may be durable at the slaves
    assert not isinstance(failure, MasterFencedError)
    assert cluster.host("b1").status().role == "failed"
    refused = produce(cluster, "b1", b"refused")
    assert isinstance(refused.exception(), HASyncFailedError)
    # The failed broker is silent: the controller elects a member of the SyncStateSet.
    cluster.run_until(lambda: cluster.master_id() in ("b2", "b3"), seconds_max=5.0)
    new_master = cluster.master_id()
    assert new_master is not None

    def serving() -> bool:
        master = cluster.host(new_master).master
        return master is not None and len(master.sync_state_set) >= 2  # the other slave

    cluster.run_until(serving, seconds_max=5.0)
    after = produce(cluster, new_master, b"after")
    cluster.run_until(after.done, seconds_max=5.0)
    assert after.exception() is None
    held = cluster.brokers[new_master].messages()
    assert held[: len(before)] == before  # nothing acknowledged is lost
    assert held[-1] == b"after"
    info = cluster.controller.machine.group_info(GROUP)
    assert info is not None and "b1" not in info.sync_state_set


def test_a_failed_slave_sync_steps_the_slave_out_and_produces_go_on(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    cluster.host("b3").background = FailingSyncs(
        storage_error(Path("/b3/log/00000000"), OSError(errno.ENOSPC, "No space left"))
    )
    first = produce(cluster, "b1", b"m1")
    cluster.run_until(lambda: cluster.host("b3").sync_failed, seconds_max=1.0)
    assert cluster.host("b3").status().role == "failed"
    assert isinstance(cluster.host("b3").failure, HASyncFailedError)
    # b3 acks nothing more: the master acknowledges once b3 has left the SyncStateSet
    # (not caught up for 2 s here), as for a slave that died.
    cluster.run_until(first.done, seconds_max=10.0)
    assert first.exception() is None
    info = cluster.controller.machine.group_info(GROUP)
    assert info is not None and info.master_id == "b1" and "b3" not in info.sync_state_set
    second = produce(cluster, "b1", b"m2")
    cluster.run_until(second.done, seconds_max=1.0)
    assert second.exception() is None
    assert cluster.brokers["b2"].messages() == [b"m1", b"m2"]


def test_a_failed_broker_reports_once_to_its_owner(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    reported: list[HASyncFailedError] = []
    host = cluster.host("b2")
    host.on_failed = reported.append
    host.background = FailingSyncs(DiskFullError("disk full while writing /b2/log: ENOSPC"))
    produce(cluster, "b1", b"m1")
    cluster.run_until(lambda: bool(reported), seconds_max=1.0)
    cluster.run(1.0)
    assert len(reported) == 1 and reported[0].broker_id == "b2" and reported[0].group == GROUP
    assert "disk full" in reported[0].reason


def test_the_sync_state_set_never_names_a_failed_master_again(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    cluster.host("b1").background = FailingSyncs(io_error())
    produce(cluster, "b1", b"m1")
    cluster.run_until(lambda: cluster.master_id() in ("b2", "b3"), seconds_max=5.0)
    cluster.run(3.0)  # long enough for heartbeats, shrinks and re-elections to settle
    info = cluster.controller.machine.group_info(GROUP)
    assert info is not None and info.master_id in ("b2", "b3")
    assert info.master_epoch == 2  # one election, not a flapping one
    assert cluster.host("b1").status().role == "failed"
    assert [b for b in BROKERS if cluster.host(b).is_master] == [info.master_id]


# --- a failed write steps the broker out too ---------------------------------------------


def fail_next_append(cluster: BrokerCluster, broker_id: str, error: StorageError) -> None:
    """The broker's next commit-log append raises `error` (nothing written, as the store's
    all-or-nothing append on a full disk); later appends write."""
    log = cluster.brokers[broker_id].log
    append = log.append

    def failing(messages: Sequence[bytes], epoch: int) -> int:
        log.append = append  # type: ignore[method-assign]
        raise error

    log.append = failing  # type: ignore[method-assign]


def test_a_failed_master_append_steps_out_and_a_member_takes_over(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    before = acknowledged(cluster, "b1", 3)
    waiting = produce(cluster, "b1", b"waiting")  # written, not yet acknowledged
    fail_next_append(cluster, "b1", DiskFullError("disk full while writing /b1/log"))
    try:
        cluster.host("b1").append([b"refused"])
    except HASyncFailedError as error:
        assert error.disk_full
    else:
        raise AssertionError("the append should have failed typed")
    assert isinstance(waiting.exception(), HASyncFailedError)
    assert cluster.host("b1").status().role == "failed"
    cluster.run_until(lambda: cluster.master_id() in ("b2", "b3"), seconds_max=5.0)
    new_master = cluster.master_id()
    assert new_master is not None
    assert cluster.brokers[new_master].messages()[: len(before)] == before
    assert b"refused" not in cluster.brokers[new_master].messages()


def test_a_failed_slave_append_steps_the_slave_out(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    fail_next_append(cluster, "b2", io_error())
    first = produce(cluster, "b1", b"m1")
    cluster.run_until(lambda: cluster.host("b2").sync_failed, seconds_max=1.0)
    assert cluster.host("b2").status().role == "failed"
    cluster.run_until(first.done, seconds_max=10.0)  # once b2 left the SyncStateSet
    assert first.exception() is None
    info = cluster.controller.machine.group_info(GROUP)
    assert info is not None and info.master_id == "b1" and "b2" not in info.sync_state_set
