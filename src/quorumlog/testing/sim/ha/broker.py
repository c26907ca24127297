"""One simulated broker: the shipped `ha.broker_host.BrokerHost` with the shipped cores, its
`SegmentCommitLog` and `EpochFile` on a `SimFileSystem`, inside a `SimProcess`.

A crash kills the process (every timer, connection and waiting produce of that incarnation
dies with it) and is a power loss (the disk keeps what was synced and, in some crashes, a
torn part of the rest) or a process kill (the OS keeps every byte written). The disk can
also halt the process in the middle of a change (`halt_after`): a crash in the middle of a
truncation (apache/rocketmq #10666) is that, at the right moment. A restart opens the log
and the epoch file again and registers with the controller, as a real restart does.

A sync can be made to fail (`fail_next_sync`): the job does not run, so nothing it would have
made durable is, and the host hears the error (EIO, or ENOSPC), as a node's thread pool
reports a failed msync.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from quorumlog.errors import StorageError
from quorumlog.ha.broker_host import BrokerHost, BrokerHostConfig
from quorumlog.ha.epoch_file import EpochFile
from quorumlog.ha.segment_commit_log import SegmentCommitLog
from quorumlog.storage.base import SyncPolicy
from quorumlog.testing.sim.events import EventQueue, derive_random
from quorumlog.testing.sim.filesystem import DiskCrashReport, SimFileSystem, SimulatedCrash
from quorumlog.testing.sim.frame_network import SimFrameNetwork
from quorumlog.testing.sim.ha.controller import broker_controller_access
from quorumlog.testing.sim.ha.links import LinkEnd, LinkHost, SimHALinks, ha_address
from quorumlog.testing.sim.process import SimBackground, SimProcess, SimScheduler

GROUP = "ha-group"
LOG_PATH = Path("/broker/log")
EPOCH_PATH = Path("/broker/epochs")
SEGMENT_BYTES_MAX = 16 * 1024
"""Small segments, so truncations cross files (unlinks, then a cut)."""
SYNC_DELAY_MS_MIN = 0
SYNC_DELAY_MS_MAX = 3
"""A commit-log sync takes this long (virtual): the host's syncs run as they do in a node,
off its thread, with produces, transfers and acks going on meanwhile; a crash before one
reports loses what it would have made durable."""


class SimBroker:
    def __init__(
        self,
        name: str,
        seed: int,
        events: EventQueue,
        frames: SimFrameNetwork,
        links: SimHALinks,
        controller_nodes: list[str],
        config: BrokerHostConfig,
    ) -> None:
        self.name = name
        self.seed = seed
        self.events = events
        self.frames = frames
        self.links = links
        self.controller_nodes = controller_nodes
        self.config = config
        self.process = SimProcess(name, events, derive_random(seed, f"resume:{name}"))
        self.process.crash_handler = self.halted
        self.scheduler = SimScheduler(self.process)
        self.disk = SimFileSystem(derive_random(seed, f"disk:{name}"))
        self.crash_random = derive_random(seed, f"crash:{name}")
        self.host: BrokerHost | None = None
        self.log: SegmentCommitLog | None = None
        self.epochs: EpochFile | None = None
        self.crashes = 0
        self.drop_alter_answers = False
        """The controller's answers to this broker's AlterSyncStateSet are lost (#5663)."""
        self.storage_failures = 0
        self.fail_next_sync: StorageError | None = None
        """The next commit-log sync of this broker fails with this (then it is cleared)."""
        self.syncs_failed = 0
        self.on_role_changed: Callable[[SimBroker], None] = lambda broker: None
        self.on_truncated: Callable[[SimBroker], None] = lambda broker: None
        """The world's checks, told when the host takes a role or a handshake truncated."""
        frames.register(name, self.process)
        links.register(name, LinkEnd(self.process, self.link_host))

    @property
    def up(self) -> bool:
        return self.process.up and self.host is not None

    def link_host(self) -> LinkHost | None:
        return self.host

    def start(self) -> None:
        """A new incarnation: open the log and the epoch file, register, serve."""
        self.disk.halt_after(None)
        self.process.boot()
        try:
            self.log = SegmentCommitLog.open(
                LOG_PATH,
                segment_bytes_max=SEGMENT_BYTES_MAX,
                sync_policy=SyncPolicy.EXPLICIT,
                file_system=self.disk,
            )
            self.epochs = EpochFile(EPOCH_PATH, self.disk)
        except (StorageError, SimulatedCrash):
            self.storage_failures += 1
            self.process.kill()
            return
        access = broker_controller_access(
            self.name,
            self.process,
            self.frames,
            self.controller_nodes,
            client_id=f"broker/{self.name}/{self.process.incarnation}",
            lose_alter_answers=lambda: self.drop_alter_answers,
        )
        self.host = BrokerHost(
            scheduler=self.scheduler,
            links=self.links.for_broker(self.name),
            controller=access,
            commit_log=self.log,
            epoch_file=self.epochs,
            group=GROUP,
            broker_id=self.name,
            address=ha_address(self.name),
            config=self.config,
            on_truncated=lambda offset: self.on_truncated(self),
            on_role_changed=lambda: self.on_role_changed(self),
            background=FaultySyncs(
                self,
                SimBackground(
                    self.process,
                    derive_random(self.seed, f"syncs:{self.name}:{self.process.incarnation}"),
                    SYNC_DELAY_MS_MIN,
                    SYNC_DELAY_MS_MAX,
                ),
            ),
        )
        self.process.enter("local", lambda _: self.started())

    def started(self) -> None:
        if self.host is not None:
            self.host.start()

    def crash(self, power_loss: bool) -> DiskCrashReport:
        if not self.process.up:
            return DiskCrashReport()
        self.crashes += 1
        self.process.kill()
        self.host = None
        self.log = None
        self.epochs = None
        self.links.broker_died(self.name)
        if power_loss:
            return self.disk.crash(
                self.crash_random, keep_unsynced=self.crash_random.random() < 0.5
            )
        self.disk.process_crash()
        return DiskCrashReport()

    def halted(self) -> None:
        """The disk stopped the process in the middle of a change: a power loss there."""
        self.crash(power_loss=True)

    def restart(self) -> None:
        if not self.process.up:
            self.start()

    def pause(self) -> None:
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()

    def describe(self) -> str:
        state = "down" if not self.up else ("paused" if self.process.paused else "up")
        if self.host is None or self.log is None or self.epochs is None:
            return f"broker {self.name}: {state}, crashes={self.crashes}"
        status = self.host.status()
        return (
            f"broker {self.name}: {state} {status.role} epoch {status.master_epoch} "
            f"max {status.max_offset} confirm {status.confirm_offset} epochs {status.epochs}"
        )


class FaultySyncs:
    """The broker's `Background`: its syncs as `SimBackground` runs them, except one armed
    to fail (`SimBroker.fail_next_sync`), which takes its time, does not run, and reports the
    error. Unarmed, it draws nothing, so a seed without the fault runs as before."""

    def __init__(self, broker: SimBroker, syncs: SimBackground) -> None:
        self.broker = broker
        self.syncs = syncs

    def submit(self, job: Callable[[], None], done: Callable[[BaseException | None], None]) -> None:
        error = self.broker.fail_next_sync
        if error is None:
            self.syncs.submit(job, done)
            return
        self.broker.fail_next_sync = None
        self.broker.syncs_failed += 1

        def failing() -> None:
            raise error

        self.syncs.submit(failing, done)


def broker_random(seed: int, name: str) -> random.Random:
    return derive_random(seed, f"broker:{name}")
