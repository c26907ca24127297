"""The handshake's truncation point (reference 003) against hand-made epoch caches."""

from __future__ import annotations

import pytest

from quorumlog.ha.epoch_file import EpochEntry
from quorumlog.ha.handshake import find_consistent_point

E = EpochEntry

CASES = [
    pytest.param(
        [E(1, 0)],
        100,
        [E(1, 0), E(2, 300)],
        500,
        100,
        id="slave-behind-in-an-epoch-the-master-ended",
    ),
    pytest.param(
        [E(1, 0), E(2, 300)], 450, [E(1, 0), E(3, 300)], 600, 300, id="old-master-divergent-epoch"
    ),
    pytest.param([E(1, 0)], 300, [E(1, 0)], 200, 200, id="slave-ahead-in-the-masters-epoch"),
    pytest.param(
        [E(1, 0), E(2, 100)], 400, [E(1, 0), E(2, 150)], 400, 100, id="same-epoch-other-start"
    ),
    pytest.param(
        [E(1, 0), E(2, 100)],
        180,
        [E(1, 0), E(2, 100), E(3, 100)],
        400,
        100,
        id="masters-epoch-empty-slave-has-its-data",
    ),
    pytest.param(
        [E(1, 0), E(2, 300)],
        250,
        [E(1, 0), E(3, 280)],
        500,
        250,
        id="entries-past-the-log-end-after-a-crash",
    ),
    pytest.param(
        [E(1, 0), E(2, 50), E(4, 90), E(6, 200)],
        260,
        [E(1, 0), E(2, 50), E(4, 90), E(5, 120), E(7, 300)],
        900,
        120,
        id="several-masters-back",
    ),
    pytest.param([E(2, 0)], 100, [E(1, 0), E(3, 40)], 300, None, id="no-epoch-in-common"),
    pytest.param([], 0, [E(1, 0)], 300, None, id="empty-slave"),
    pytest.param([E(1, 0)], 0, [E(1, 0)], 0, 0, id="both-empty-logs"),
]


@pytest.mark.parametrize(
    ("slave_epochs", "slave_max", "master_epochs", "master_max", "expected"), CASES
)
def test_the_consistent_point(
    slave_epochs: list[EpochEntry],
    slave_max: int,
    master_epochs: list[EpochEntry],
    master_max: int,
    expected: int | None,
) -> None:
    found = find_consistent_point(slave_epochs, slave_max, master_epochs, master_max)
    assert found == expected


def test_the_newest_matching_epoch_wins_not_the_oldest() -> None:
    """From the back: an older match would cut more than needed."""
    slave = [E(1, 0), E(3, 100)]
    master = [E(1, 0), E(3, 100), E(5, 700)]
    assert find_consistent_point(slave, 650, master, 800) == 650
