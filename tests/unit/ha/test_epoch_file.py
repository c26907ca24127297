"""The epoch file: its format, its rules, and a crash at every point of a scripted run."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from quorumlog.errors import CorruptLogError, FormatVersionError
from quorumlog.ha.epoch_file import (
    EPOCH_FILE_VERSION,
    EpochEntry,
    EpochFile,
    EpochRange,
    encode_epoch_file,
    epoch_at,
    epoch_ranges,
)
from quorumlog.raft.invariants import InvariantViolation
from quorumlog.storage.filesystem import ensure_directory
from quorumlog.testing.sim.filesystem import SimFileSystem, SimulatedCrash

PATH = Path("/broker/epochs")


def test_entries_survive_a_reload_and_a_power_loss() -> None:
    disk = SimFileSystem(random.Random(1))
    epochs = EpochFile(PATH, disk)
    epochs.append(1, 0)
    epochs.append(3, 400)
    epochs.append(4, 400)  # epoch 3 wrote nothing: an empty range, kept
    disk.crash(random.Random(2), keep_unsynced=False)
    reloaded = EpochFile(PATH, disk)
    assert reloaded.entries == (EpochEntry(1, 0), EpochEntry(3, 400), EpochEntry(4, 400))
    assert reloaded.last_epoch == 4
    assert reloaded.start_of(3) == 400
    assert reloaded.ranges(900) == [
        EpochRange(1, 0, 400),
        EpochRange(3, 400, 400),
        EpochRange(4, 400, 900),
    ]


def test_appending_an_older_epoch_or_an_earlier_start_is_refused() -> None:
    epochs = EpochFile(PATH, SimFileSystem(random.Random(1)))
    epochs.append(2, 100)
    with pytest.raises(InvariantViolation):
        epochs.append(1, 200)
    with pytest.raises(InvariantViolation):
        epochs.append(3, 50)
    epochs.append(2, 100)  # the same last entry again (a restarted master): no change
    assert epochs.entries == (EpochEntry(2, 100),)


def test_truncate_from_drops_every_entry_starting_at_or_after_the_offset() -> None:
    epochs = EpochFile(PATH, SimFileSystem(random.Random(1)))
    for epoch, start in [(1, 0), (2, 100), (3, 250), (5, 250)]:
        epochs.append(epoch, start)
    epochs.truncate_from(251)
    assert [entry.epoch for entry in epochs.entries] == [1, 2, 3, 5]
    epochs.truncate_from(250)
    assert epochs.entries == (EpochEntry(1, 0), EpochEntry(2, 100))
    epochs.truncate_from(0)
    assert epochs.entries == ()
    assert epochs.last_epoch == 0


def test_ranges_never_reach_past_the_log_end() -> None:
    """Entries left past the end by a crash between the truncations are clamped."""
    entries = [EpochEntry(1, 0), EpochEntry(2, 300), EpochEntry(4, 500)]
    assert epoch_ranges(entries, 200) == [
        EpochRange(1, 0, 200),
        EpochRange(2, 300, 200),
        EpochRange(4, 500, 200),
    ]
    assert epoch_at(entries, 299) == 1
    assert epoch_at(entries, 300) == 2
    assert epoch_at([EpochEntry(1, 0), EpochEntry(2, 10), EpochEntry(3, 10)], 10) == 3


def test_a_newer_format_is_refused_with_one_line_naming_both_versions() -> None:
    disk = SimFileSystem(random.Random(1))
    data = bytearray(encode_epoch_file([EpochEntry(1, 0)]))
    struct.pack_into("<I", data, 4, EPOCH_FILE_VERSION + 1)
    ensure_directory(disk, PATH.parent)
    writer = disk.create_file(PATH, exclusive=False)
    writer.write_at(bytes(data), 0)
    writer.close()
    with pytest.raises(FormatVersionError) as raised:
        EpochFile(PATH, disk)
    message = str(raised.value)
    assert "\n" not in message
    assert f"version {EPOCH_FILE_VERSION + 1}" in message
    assert f"version {EPOCH_FILE_VERSION}" in message


@pytest.mark.parametrize("damage", ["flip", "short", "magic", "unordered"])
def test_damage_is_reported_never_read_past(damage: str) -> None:
    disk = SimFileSystem(random.Random(1))
    EpochFile(PATH, disk).append(1, 0)
    data = bytearray(encode_epoch_file([EpochEntry(1, 0), EpochEntry(2, 64)]))
    if damage == "flip":
        data[-3] ^= 0x10
    elif damage == "short":
        data = data[:-8]
    elif damage == "magic":
        data[0] ^= 0xFF
    else:  # a well-formed file whose entries break the rules
        unordered = [EpochEntry(2, 0), EpochEntry(1, 64)]
        data = bytearray(encode_epoch_file(unordered))  # encoding does not check the rules
    writer = disk.create_file(PATH, exclusive=False)
    writer.write_at(bytes(data), 0)
    writer.close()
    with pytest.raises(CorruptLogError):
        EpochFile(PATH, disk)


# --- every crash point ---------------------------------------------------------------------

SCRIPT: list[tuple[str, int, int]] = [
    ("append", 1, 0),
    ("append", 2, 100),
    ("append", 3, 180),
    ("truncate_from", 150, 0),
    ("append", 4, 150),
    ("append", 6, 400),
    ("truncate_from", 0, 0),
    ("append", 7, 0),
]


def apply(entries: tuple[EpochEntry, ...], step: tuple[str, int, int]) -> tuple[EpochEntry, ...]:
    kind, first, second = step
    if kind == "append":
        return (*entries, EpochEntry(first, second))
    return tuple(entry for entry in entries if entry.start_offset < first)


def run_script(disk: SimFileSystem, halt_after: int | None) -> list[tuple[EpochEntry, ...]]:
    """Run the script until the disk halts it; the lists a reload may find."""
    disk.halt_after(halt_after)
    state: tuple[EpochEntry, ...] = ()
    try:
        epochs = EpochFile(PATH, disk)
        for step in SCRIPT:
            after = apply(state, step)
            try:
                if step[0] == "append":
                    epochs.append(step[1], step[2])
                else:
                    epochs.truncate_from(step[1])
            except SimulatedCrash:
                return [state, after]
            state = after
    except SimulatedCrash:
        return [state]
    disk.halt_after(None)
    return [state]


def test_every_crash_point_reloads_the_old_or_the_new_list() -> None:
    counting = SimFileSystem(random.Random(0))
    run_script(counting, None)
    total = counting.operation_count
    assert total > 30  # every step writes, syncs, renames and syncs the directory
    for halt_after in range(total + 1):
        for seed in range(3):
            disk = SimFileSystem(random.Random(seed))
            allowed = run_script(disk, halt_after)
            disk.crash(random.Random(halt_after * 100 + seed), keep_unsynced=seed != 2)
            found = EpochFile(PATH, disk).entries
            assert found in allowed, f"halt after {halt_after}, seed {seed}: {found}"
