"""A broker's syncs off its thread (`BrokerHost` with a `Background`): the loop goes on
while a sync runs, and only a returned sync counts.

A `HeldSyncs` background keeps each job until the test lets it run: a disk as slow as the
test wants. The guarantees checked: a produce is acknowledged only when every SyncStateSet
member has it durably (the master's sync returned, each slave's sync returned before its
ack); the master transfers new produces while its sync is in flight; appends made during a
sync wait for the next one, which begins when it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .test_broker_host import BROKERS, produce, started

Job = Callable[[], None]
Done = Callable[[BaseException | None], None]


class HeldSyncs:
    """A `Background` whose jobs wait until `release` (then run and report at once)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Job, Done]] = []
        self.submitted = 0

    def submit(self, job: Job, done: Done) -> None:
        self.submitted += 1
        self.waiting.append((job, done))

    def release(self) -> None:
        job, done = self.waiting.pop(0)
        job()
        done(None)


def test_the_master_acknowledges_after_its_sync_returns_and_transfers_meanwhile(
    tmp_path: Path,
) -> None:
    cluster = started(tmp_path)
    held = HeldSyncs()
    cluster.host("b1").background = held  # the master's syncs from now on
    first = produce(cluster, "b1", b"m1")
    cluster.run(0.2)
    slaves = [cluster.brokers[broker_id] for broker_id in ("b2", "b3")]
    assert all(broker.messages() == [b"m1"] for broker in slaves)  # replicated, acked
    assert len(held.waiting) == 1 and not first.done()  # the master's own sync is not back
    second = produce(cluster, "b1", b"m2")
    cluster.run(0.2)
    assert all(broker.messages() == [b"m1", b"m2"] for broker in slaves)  # sent meanwhile
    assert held.submitted == 1  # m2 waits for the next sync: one in flight at a time
    held.release()
    cluster.run(0.05)
    assert first.done() and first.result() < cluster.brokers["b1"].log.max_offset
    assert not second.done()  # its sync began when the first returned
    assert len(held.waiting) == 1
    held.release()
    cluster.run(0.05)
    assert second.done() and second.result() == cluster.brokers["b1"].log.max_offset


def test_a_slave_acks_only_what_its_returned_sync_made_durable(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    held = HeldSyncs()
    cluster.host("b2").background = held
    done = produce(cluster, "b1", b"m1")
    # Heartbeat batches (every 0.1 s here) are acked meanwhile: with the durable offset,
    # so the master never counts b2 as holding m1. Well within the 2 s before b2 would
    # leave the SyncStateSet.
    cluster.run(0.6)
    assert cluster.brokers["b2"].messages() == [b"m1"]  # appended, not durable
    assert len(held.waiting) == 1
    assert not done.done()
    assert cluster.host("b1").confirm_offset < cluster.brokers["b1"].log.max_offset
    held.release()
    cluster.run(0.05)
    assert done.done() and done.result() == cluster.host("b1").confirm_offset


def test_a_slave_takes_batches_while_it_syncs_and_syncs_them_next(tmp_path: Path) -> None:
    cluster = started(tmp_path)
    held = HeldSyncs()
    cluster.host("b3").background = held
    first = produce(cluster, "b1", b"m1")
    cluster.run(0.1)
    second = produce(cluster, "b1", b"m2")
    cluster.run(0.1)
    assert cluster.brokers["b3"].messages() == [b"m1", b"m2"]  # taken during the sync
    assert held.submitted == 1
    held.release()
    cluster.run(0.05)
    assert first.done() and not second.done()
    held.release()
    cluster.run(0.05)
    assert second.done()
    assert {cluster.brokers[b].log.durable_offset for b in BROKERS} == {second.result()}
