"""Every simulated bookie and client of one seed, on one event queue and one network.

The registry: every bookie is registered in the metadata store at the start; a periodic
check (the metadata group's liveness, `REGISTRY_CHECK_MS`) lists a bookie as writable only
while it heartbeats within `BOOKIE_LIVENESS_MS` and its storage takes writes. So, as in
production, a writer may pick a bookie that just died or filled its disk.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import msgspec

from quorumlog.errors import StorageError
from quorumlog.ledger.protocol_actions import LedgerProtocolConfig
from quorumlog.testing.sim.checks import check_invariant
from quorumlog.testing.sim.events import EventQueue, derive_random
from quorumlog.testing.sim.frame_network import SimFrameNetwork
from quorumlog.testing.sim.ledger.bookies import SimBookie, SimBookieOptions
from quorumlog.testing.sim.ledger.clients import LinkFaults, SimLedgerClient
from quorumlog.testing.sim.ledger.metadata import MetadataFaults, RecordingMetadataStore
from quorumlog.testing.sim.network import NetworkFaults
from quorumlog.testing.sim.trace import TraceRecorder

REGISTRY_CHECK_MS = 200
BOOKIE_LIVENESS_MS = 1000


class WorldOptions(msgspec.Struct, frozen=True):
    bookie_count: int = 5
    bookie: SimBookieOptions = SimBookieOptions()
    network: NetworkFaults = NetworkFaults()
    links: LinkFaults = LinkFaults()
    metadata: MetadataFaults = MetadataFaults()
    protocol: LedgerProtocolConfig = LedgerProtocolConfig()


class LedgerWorld:
    def __init__(self, seed: int, options: WorldOptions, trace: TraceRecorder | None) -> None:
        self.seed = seed
        self.options = options
        self.trace = trace
        self.events = EventQueue()
        self.network = SimFrameNetwork(
            self.events, derive_random(seed, "network"), options.network, set(), trace
        )
        self.store = RecordingMetadataStore(self.events)
        self.bookies: dict[str, SimBookie] = {}
        for number in range(options.bookie_count):
            bookie_id = f"b{number}"
            bookie = SimBookie(
                bookie_id,
                self.events,
                options.bookie,
                (
                    derive_random(seed, f"disk:{bookie_id}"),
                    derive_random(seed, f"sync:{bookie_id}"),
                    derive_random(seed, f"resume:{bookie_id}"),
                ),
            )
            self.bookies[bookie_id] = bookie
            self.network.register(bookie_id, bookie.process, bookie.handle)
            self.store.register_bookie(bookie_id)
            bookie.start()
        self.clients: dict[str, SimLedgerClient] = {}
        self.events.schedule(REGISTRY_CHECK_MS, self.check_registry)

    @property
    def now_ms(self) -> int:
        return self.events.now_ms

    def add_client(self, name: str) -> SimLedgerClient:
        seed = self.seed

        def client_random(component: str) -> random.Random:
            return derive_random(seed, f"client:{name}:{component}")

        client = SimLedgerClient(
            name,
            self.events,
            self.network,
            self.store,
            self.bookie_incarnation,
            self.options.protocol,
            (self.options.links, self.options.metadata),
            client_random,
        )
        self.clients[name] = client
        return client

    def bookie_incarnation(self, bookie_id: str) -> int | None:
        bookie = self.bookies.get(bookie_id)
        if bookie is None or not bookie.up:
            return None
        return bookie.process.incarnation

    def check_registry(self, _: object) -> None:
        now_ms = self.events.now_ms
        for bookie_id, bookie in self.bookies.items():
            alive = bookie.up and now_ms - bookie.heartbeat_ms <= BOOKIE_LIVENESS_MS
            writable = alive and bookie.writable
            if self.store.bookies[bookie_id].writable != writable:
                self.store.set_bookie_writable(bookie_id, writable)
        self.events.schedule(REGISTRY_CHECK_MS, self.check_registry)

    # --- faults --------------------------------------------------------------------------

    def crash_bookie(self, bookie_id: str, power_loss: bool, keep_unsynced: bool) -> None:
        bookie = self.bookies[bookie_id]
        report = bookie.crash(power_loss, keep_unsynced)
        self.note(f"crash {bookie_id} power_loss={power_loss} {report!r}")
        if not power_loss:
            for client in self.clients.values():
                client.links.bookie_killed(bookie_id)

    def restart_bookie(self, bookie_id: str) -> bool:
        """Start the bookie again; False if its storage would not open (a full disk)."""
        bookie = self.bookies[bookie_id]
        try:
            bookie.start()
        except StorageError as error:
            self.note(f"restart {bookie_id} failed: {error}")
            return False
        bookie.restarts += 1
        self.note(f"restart {bookie_id}")
        return True

    def require_restart(self, bookie_id: str) -> None:
        """Restart at the final heal, when nothing stands in the way: it must open."""
        opened = self.restart_bookie(bookie_id)
        check_invariant(opened, f"bookie {bookie_id} did not open its storage after a heal")

    def partition(self, bookie_ids: list[str], client_names: list[str]) -> None:
        for bookie_id in bookie_ids:
            for name in client_names:
                self.network.blocked.add((bookie_id, name))
                self.network.blocked.add((name, bookie_id))
        self.note(f"partition bookies {bookie_ids} from clients {client_names}")

    def heal_network(self) -> None:
        self.network.blocked.clear()
        self.note("heal network")

    def note(self, text: str) -> None:
        if self.trace is not None:
            self.trace.record(self.events.now_ms, text)

    # --- running -------------------------------------------------------------------------

    def run_until_time(self, time_ms: int) -> None:
        self.events.run_until(time_ms)

    def run_until(self, condition: Callable[[], bool], deadline_ms: int, step_ms: int = 20) -> bool:
        """Run in steps until `condition` holds (True) or the deadline passes (False)."""
        while not condition():
            if self.events.now_ms >= deadline_ms:
                return False
            self.events.run_until(min(deadline_ms, self.events.now_ms + step_ms))
        return True

    def describe(self) -> str:
        lines = [bookie.describe() for bookie in self.bookies.values()]
        lines.extend(client.describe() for client in self.clients.values())
        for ledger_id in self.store.list_ledgers():
            metadata = self.store.read_ledger(ledger_id)
            lines.append(
                f"ledger {ledger_id}: v{metadata.version} {metadata.state.value} last "
                f"{metadata.last_entry_id} ensembles {metadata.ensembles}"
            )
        return "\n".join(lines)
