"""The faults of one ledger seed, drawn from the seed: bookies crash (a kill, or a power
loss that loses or tears what was not synced), halt in the middle of a disk change, pause,
fill their disks; partitions cut bookies off from clients; clients pause (a writer in a
long GC pause is the classic fenced writer) and writers crash for good. Each fault ends
after a seeded time; `heal_all` ends every one at once (the final heal before the checks).

At most `down_max` bookies are down or paused at once, so writers usually find
replacements; safety never depends on it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgspec

from quorumlog.testing.sim.events import draw_int
from quorumlog.testing.sim.ledger.world import LedgerWorld

DISK_FULL_SLACK_BYTES_MAX = 4096
CRASH_MID_WRITE_CHANGES_MAX = 12
DEFAULT_WEIGHTS = {
    "crash": 3,
    "power_loss": 3,
    "crash_mid_write": 2,
    "pause_bookie": 2,
    "partition": 2,
    "disk_full": 2,
    "pause_client": 2,
    "crash_writer": 1,
}


class LedgerNemesisOptions(msgspec.Struct, frozen=True):
    interval_ms_min: int = 100
    interval_ms_max: int = 1000
    fault_ms_min: int = 100
    fault_ms_max: int = 1500
    down_max: int = 2
    torn_tail_probability: float = 0.5
    weights: dict[str, int] = msgspec.field(default_factory=lambda: dict(DEFAULT_WEIGHTS))


class LedgerNemesis:
    def __init__(self, world: LedgerWorld, options: LedgerNemesisOptions, rng: random.Random):
        self.world = world
        self.options = options
        self.rng = rng
        self.down: set[str] = set()
        self.paused_clients: set[str] = set()
        self.active = False
        self.faults: dict[str, int] = {}
        self.actions = {
            "crash": self.crash,
            "power_loss": self.power_loss,
            "crash_mid_write": self.crash_mid_write,
            "pause_bookie": self.pause_bookie,
            "partition": self.partition,
            "disk_full": self.disk_full,
            "pause_client": self.pause_client,
            "crash_writer": self.crash_writer,
        }
        for bookie_id, bookie in world.bookies.items():
            bookie.process.crash_handler = self.halted_handler(bookie_id)

    def start(self) -> None:
        self.active = True
        self.schedule_next()

    def schedule_next(self) -> None:
        options = self.options
        delay_ms = draw_int(self.rng, options.interval_ms_min, options.interval_ms_max)
        self.world.events.schedule(delay_ms, self.step)

    def fault_ms(self) -> int:
        return draw_int(self.rng, self.options.fault_ms_min, self.options.fault_ms_max)

    def step(self, _: object) -> None:
        if not self.active:
            return
        names = sorted(name for name, weight in self.options.weights.items() if weight > 0)
        if names:
            weights = [self.options.weights[name] for name in names]
            name = self.rng.choices(names, weights)[0]
            if self.actions[name]():
                self.faults[name] = self.faults.get(name, 0) + 1
        self.schedule_next()

    def later(self, callback: Callable[[Any], None], argument: object = None) -> None:
        self.world.events.schedule(self.fault_ms(), callback, argument)

    # --- bookies -------------------------------------------------------------------------

    def pick_bookie(self) -> str | None:
        if len(self.down) >= self.options.down_max:
            return None
        candidates = sorted(
            bookie_id
            for bookie_id, bookie in self.world.bookies.items()
            if bookie_id not in self.down and bookie.up
        )
        return self.rng.choice(candidates) if candidates else None

    def crash(self, power_loss: bool = False) -> bool:
        bookie_id = self.pick_bookie()
        if bookie_id is None:
            return False
        keep_unsynced = self.rng.random() < self.options.torn_tail_probability
        self.down.add(bookie_id)
        self.world.crash_bookie(bookie_id, power_loss, keep_unsynced)
        self.later(self.restart, bookie_id)
        return True

    def power_loss(self) -> bool:
        return self.crash(power_loss=True)

    def crash_mid_write(self) -> bool:
        """Arm the disk to halt the process at a later change (then a power loss)."""
        bookie_id = self.pick_bookie()
        if bookie_id is None:
            return False
        self.down.add(bookie_id)
        changes = draw_int(self.rng, 0, CRASH_MID_WRITE_CHANGES_MAX)
        self.world.bookies[bookie_id].file_system.halt_after(changes)
        self.world.note(f"arm {bookie_id} to halt after {changes} disk changes")
        self.later(self.restart, bookie_id)
        return True

    def halted_handler(self, bookie_id: str) -> Callable[[], None]:
        def halted() -> None:
            # The disk stopped the process mid-change: a power loss at that very point.
            keep_unsynced = self.rng.random() < self.options.torn_tail_probability
            self.world.crash_bookie(bookie_id, True, keep_unsynced)
            if bookie_id not in self.down:
                self.down.add(bookie_id)
                self.later(self.restart, bookie_id)

        return halted

    def restart(self, bookie_id: str) -> None:
        if bookie_id not in self.down:
            return
        self.down.discard(bookie_id)
        bookie = self.world.bookies[bookie_id]
        bookie.file_system.halt_after(None)
        if not bookie.process.up and not self.world.restart_bookie(bookie_id):
            self.down.add(bookie_id)  # it could not open its storage yet: try again later
            self.later(self.restart, bookie_id)

    def pause_bookie(self) -> bool:
        bookie_id = self.pick_bookie()
        if bookie_id is None:
            return False
        self.down.add(bookie_id)
        self.world.bookies[bookie_id].process.pause()
        self.world.note(f"pause {bookie_id}")
        self.later(self.resume_bookie, bookie_id)
        return True

    def resume_bookie(self, bookie_id: str) -> None:
        if bookie_id in self.down:
            self.down.discard(bookie_id)
            self.world.bookies[bookie_id].process.resume()
            self.world.note(f"resume {bookie_id}")

    def disk_full(self) -> bool:
        bookie_id = self.rng.choice(sorted(self.world.bookies))
        file_system = self.world.bookies[bookie_id].file_system
        slack = draw_int(self.rng, 0, DISK_FULL_SLACK_BYTES_MAX)
        file_system.bytes_max = file_system.bytes_used + slack
        self.world.note(f"disk of {bookie_id} full after {slack} more bytes")
        self.later(self.free_disk, bookie_id)
        return True

    def free_disk(self, bookie_id: str) -> None:
        self.world.bookies[bookie_id].file_system.bytes_max = None

    # --- network and clients -------------------------------------------------------------

    def partition(self) -> bool:
        bookie_ids = sorted(self.world.bookies)
        client_names = sorted(self.world.clients)
        if not client_names:
            return False
        cut_bookies = self.rng.sample(bookie_ids, draw_int(self.rng, 1, 2))
        cut_clients = self.rng.sample(client_names, draw_int(self.rng, 1, len(client_names)))
        self.world.partition(cut_bookies, cut_clients)
        self.later(self.heal_partition)
        return True

    def heal_partition(self, _: object) -> None:
        self.world.heal_network()

    def pause_client(self) -> bool:
        candidates = sorted(set(self.world.clients) - self.paused_clients)
        if not candidates:
            return False
        name = self.rng.choice(candidates)
        self.paused_clients.add(name)
        self.world.clients[name].process.pause()
        self.world.note(f"pause client {name}")
        self.later(self.resume_client, name)
        return True

    def crash_writer(self) -> bool:
        """A writer's process dies for good: what it was told stays recorded, and a
        recovery must close the ledger without it."""
        candidates = sorted(
            name
            for name, client in self.world.clients.items()
            if name.startswith("writer") and client.process.up and name not in self.paused_clients
        )
        if not candidates:
            return False
        name = self.rng.choice(candidates)
        self.world.clients[name].process.kill()
        self.world.note(f"crash client {name}")
        return True

    def resume_client(self, name: str) -> None:
        if name in self.paused_clients:
            self.paused_clients.discard(name)
            self.world.clients[name].process.resume()
            self.world.note(f"resume client {name}")

    # --- the end -------------------------------------------------------------------------

    def heal_all(self) -> None:
        """End every fault now and inject no more."""
        self.active = False
        self.world.heal_network()
        for bookie_id in sorted(self.world.bookies):
            bookie = self.world.bookies[bookie_id]
            bookie.file_system.bytes_max = None
            bookie.file_system.halt_after(None)
            if bookie.process.paused:
                bookie.process.resume()
            if not bookie.process.up:
                self.world.require_restart(bookie_id)
        self.down.clear()
        for name in sorted(self.paused_clients):
            self.world.clients[name].process.resume()
        self.paused_clients.clear()
