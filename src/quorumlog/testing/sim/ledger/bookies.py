"""One simulated bookie: the shipped `Bookie` on the shipped `BookieStorage`, on a
`SimFileSystem`, inside a `SimProcess`.

A crash kills the process (every sync job, timer and queued request of that incarnation
dies with it) and is either a power loss (the disk keeps what was synced and, in some
crashes, a torn part of the rest) or a process kill (the OS keeps every byte written). A
restart opens the storage again, which replays its files (the journal) as a real restart
does. The disk can also halt the process in the middle of a change (`halt_after`), fill up,
and flip bits on reads. While up, the bookie heartbeats into the registry with whether it
takes writes (a full disk turns it read-only there).
"""

from __future__ import annotations

import random
from pathlib import Path

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import StorageError
from quorumlog.ledger.bookie import Bookie, BookieSettings
from quorumlog.ledger.bookie_server import BOOKIE_REQUEST_TYPES
from quorumlog.ledger.bookie_storage import BookieStorage, BookieStorageSettings
from quorumlog.testing.sim.disk import TruthfulReads
from quorumlog.testing.sim.events import EventQueue
from quorumlog.testing.sim.filesystem import DiskCrashReport, SimFileSystem
from quorumlog.testing.sim.frame_network import Replier
from quorumlog.testing.sim.process import SimBackground, SimProcess

BOOKIE_ROOT = Path("/bookie")
LOG_FILE_BYTES_MAX = 48 * 1024
"""Small log files, so rolling to a new file (and collecting old ones) happens in runs."""
HEARTBEAT_MS = 250


class SimBookieOptions(msgspec.Struct, frozen=True):
    fsync_ms_min: int = 0
    fsync_ms_max: int = 2
    read_bit_flip_probability: float = 0.0


class SimBookie:
    def __init__(
        self,
        bookie_id: str,
        events: EventQueue,
        options: SimBookieOptions,
        seed_random: tuple[random.Random, random.Random, random.Random],
    ) -> None:
        """`seed_random`: the disk's stream, the sync latency's, the resume order's."""
        disk_random, sync_random, resume_random = seed_random
        self.bookie_id = bookie_id
        self.events = events
        self.options = options
        self.process = SimProcess(f"bookie {bookie_id}", events, resume_random)
        self.file_system = SimFileSystem(
            disk_random, read_bit_flip_probability=options.read_bit_flip_probability
        )
        self.truthful_reads = TruthfulReads(self.file_system)
        self.sync_random = sync_random
        self.bookie: Bookie | None = None
        self.heartbeat_ms = 0
        """When the last heartbeat ran (the registry's liveness reads it)."""
        self.crashes = 0
        self.restarts = 0

    @property
    def up(self) -> bool:
        return self.process.up and self.bookie is not None

    @property
    def writable(self) -> bool:
        return self.bookie is not None and self.bookie.writable

    def start(self) -> None:
        """Boot a new incarnation: open (replay) the storage, then serve and heartbeat."""
        self.file_system.halt_after(None)
        self.process.boot()
        # Opened with reads that never flip: a flip at open would stop the restart itself
        # (bookie storage's open under damage has its own tests); flips are for serving.
        try:
            with self.truthful_reads:
                storage = BookieStorage.open(
                    BOOKIE_ROOT,
                    file_system=self.file_system,
                    settings=BookieStorageSettings(file_bytes_max=LOG_FILE_BYTES_MAX),
                )
        except StorageError:
            self.process.kill()
            raise
        background = SimBackground(
            self.process, self.sync_random, self.options.fsync_ms_min, self.options.fsync_ms_max
        )
        self.bookie = Bookie(storage, background, self.process.call_soon, BookieSettings())
        self.heartbeat(None)

    def heartbeat(self, _: object) -> None:
        self.heartbeat_ms = self.events.now_ms
        self.process.schedule(HEARTBEAT_MS, self.heartbeat)

    def crash(self, power_loss: bool, keep_unsynced: bool) -> DiskCrashReport:
        """Kill the process; a power loss also loses (or tears) what was not synced."""
        self.crashes += 1
        self.process.kill()
        self.bookie = None
        if power_loss:
            return self.file_system.crash(self.sync_random, keep_unsynced=keep_unsynced)
        self.file_system.process_crash()
        return DiskCrashReport()

    def handle(self, request: wire.ClientRequest, reply: Replier) -> None:
        """A frame that arrived for this bookie (inside its process)."""
        bookie = self.bookie
        if bookie is None:
            return
        if isinstance(request, BOOKIE_REQUEST_TYPES):
            bookie.handle(request, reply)
            return
        reply(
            wire.ErrorResponse(
                request_id=getattr(request, "request_id", 0),
                code=wire.ErrorCode.BAD_REQUEST,
                message=f"{type(request).__name__} is not a bookie request",
            )
        )

    def describe(self) -> str:
        state = "down"
        if self.up:
            state = "paused" if self.process.paused else "up"
        ledgers = self.bookie.storage.ledger_ids() if self.bookie is not None else []
        return (
            f"bookie {self.bookie_id}: {state}, writable={self.writable}, ledgers={ledgers}, "
            f"crashes={self.crashes}, disk={self.file_system!r}"
        )
