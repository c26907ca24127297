"""PeerLiveness reports a silent peer once and pings on schedule; GroupTicker ticks only the
groups that want ticks, from one timer."""

from __future__ import annotations

from quorumlog.runtime.liveness import PeerLiveness
from quorumlog.runtime.ticker import GroupTicker
from quorumlog.testing.manual import ManualScheduler


def test_a_silent_peer_is_reported_once_and_again_after_it_was_heard() -> None:
    pings: list[str] = []
    lost: list[str] = []
    liveness = PeerLiveness(
        "n1", ping=pings.append, unreachable=lost.append, ping_ticks=2, silent_ticks_max=5
    )
    liveness.set_peers(["n1", "n2", "n3"])
    for _ in range(5):
        liveness.tick()
        liveness.heard("n3")
    assert lost == []
    liveness.tick()  # n2: six ticks of silence
    assert lost == ["n2"]
    for _ in range(10):
        liveness.tick()
        liveness.heard("n3")
    assert lost == ["n2"]  # once per silence
    liveness.heard("n2")
    assert liveness.is_reachable("n2")
    for _ in range(6):
        liveness.tick()
        liveness.heard("n3")
    assert lost == ["n2", "n2"]
    assert pings[:2] == ["n2", "n3"] and len(pings) == 2 * (22 // 2)


def test_a_peer_heard_again_is_reported_reachable_once() -> None:
    lost: list[str] = []
    back: list[str] = []
    liveness = PeerLiveness(
        "n1",
        ping=lambda peer: None,
        unreachable=lost.append,
        silent_ticks_max=3,
        reachable=back.append,
    )
    liveness.set_peers(["n2"])
    liveness.heard("n2")
    assert back == []  # never lost: nothing to report
    for _ in range(4):
        liveness.tick()
    assert lost == ["n2"]
    liveness.heard("n2")
    liveness.heard("n2")
    assert back == ["n2"]


class CountingGroup:
    def __init__(self, ticks_wanted: int) -> None:
        self.ticks = 0
        self.ticks_wanted = ticks_wanted

    def tick(self) -> bool:
        self.ticks += 1
        return self.ticks < self.ticks_wanted


def test_the_ticker_stops_ticking_a_group_that_wants_no_more_until_it_wakes() -> None:
    scheduler = ManualScheduler()
    ticker = GroupTicker(scheduler, tick_seconds=1.0)
    quiet_soon = CountingGroup(ticks_wanted=2)
    busy = CountingGroup(ticks_wanted=10**9)
    node_work: list[int] = []
    ticker.every_tick.append(lambda: node_work.append(ticker.ticks))
    ticker.wake(quiet_soon)
    ticker.wake(busy)
    ticker.start()
    scheduler.advance(5.0)
    assert (quiet_soon.ticks, busy.ticks, len(node_work)) == (2, 5, 5)
    ticker.wake(quiet_soon)
    scheduler.advance(1.0)
    assert (quiet_soon.ticks, busy.ticks) == (3, 6)
    ticker.stop()
    scheduler.advance(3.0)
    assert busy.ticks == 6
