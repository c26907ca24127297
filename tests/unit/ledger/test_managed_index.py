"""The managed ledger's offset -> entry index (ledger/managed_index.py): exact for the
ledger an owner wrote, found by probing (interpolation, then midpoints) for one known by
its ends only, and a read that contradicts what is known refused."""

from __future__ import annotations

import math
from itertools import accumulate

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from quorumlog.errors import LedgerMetadataFormatError
from quorumlog.ledger.managed_index import EntryIndex


def starts_of(first_offset: int, counts: list[int]) -> list[int]:
    """The first offset of each entry, and one past the last record at the end."""
    return [first_offset, *(first_offset + total for total in accumulate(counts))]


def entry_holding(starts: list[int], offset: int) -> int:
    return next(entry for entry in range(len(starts) - 1) if starts[entry + 1] > offset)


counts_strategy = st.lists(st.integers(1, 6), min_size=1, max_size=80) | st.lists(
    st.sampled_from([1, 500]), min_size=1, max_size=80
)


@settings(max_examples=100, deadline=None)
@given(counts=counts_strategy, first_offset=st.integers(0, 10**12))
def test_the_written_ledgers_index_places_every_offset_without_a_probe(
    counts: list[int], first_offset: int
) -> None:
    index = EntryIndex(first_offset)
    index.append(counts[:3])
    index.append(counts[3:])
    starts = starts_of(first_offset, counts)
    assert (index.entry_count, index.end_offset) == (len(counts), starts[-1])
    for offset in range(starts[0], starts[-1]):
        assert index.entry_of(offset) == entry_holding(starts, offset)


@settings(max_examples=150, deadline=None)
@given(counts=counts_strategy, data=st.data())
def test_probing_a_ledger_known_by_its_ends_finds_any_offset_in_logarithmic_probes(
    counts: list[int], data: st.DataObject
) -> None:
    starts = starts_of(100, counts)
    index = EntryIndex.closed(100, len(counts), starts[-1])
    bound = 2 * math.ceil(math.log2(len(counts) + 1)) + 2
    for _ in range(3):  # later lookups start from what earlier probes taught
        offset = data.draw(st.integers(starts[0], starts[-1] - 1))
        probes = 0
        while (entry := index.entry_of(offset)) is None:
            probe = index.probe(offset, by_midpoint=probes % 2 == 1)
            assert 0 <= probe < len(counts)
            index.learn_point(probe, starts[probe])  # what reading entry `probe` shows
            index.learn_point(probe + 1, starts[probe + 1])
            probes += 1
            assert probes <= bound, f"{probes} probes for {len(counts)} entries"
        assert entry == entry_holding(starts, offset)
        last = index.last_entry_for(min(offset + 10, starts[-1] - 1))
        assert entry <= last < len(counts)


@settings(max_examples=100, deadline=None)
@given(counts=counts_strategy, points_max=st.integers(2, 9))
def test_a_thinned_index_keeps_its_ends_and_evenly_spread_points(
    counts: list[int], points_max: int
) -> None:
    starts = starts_of(7, counts)
    whole = EntryIndex(7)
    whole.append(counts)
    thinned = whole.thinned(points_max)
    if len(counts) + 1 <= points_max:
        assert thinned.point_count == len(counts) + 1
    else:
        assert 2 <= thinned.point_count <= points_max
        # Evenly spread: no gap between kept points is much wider than the average.
        gaps = [b - a for a, b in zip(thinned.entry_ids, thinned.entry_ids[1:], strict=False)]
        assert max(gaps) <= 2 * len(counts) / (points_max - 1) + 1
    assert (thinned.first_offset, thinned.entry_count, thinned.end_offset) == (
        7,
        len(counts),
        starts[-1],
    )
    for entry_id, offset in zip(thinned.entry_ids, thinned.offsets, strict=True):
        assert starts[entry_id] == offset
    assert whole.point_count == len(counts) + 1  # thinning copies


def test_uniform_batches_are_found_by_the_first_probe() -> None:
    counts = [100] * 1_000
    starts = starts_of(0, counts)
    index = EntryIndex.closed(0, len(counts), starts[-1])
    probe = index.probe(73_456, by_midpoint=False)
    assert probe == 734
    index.learn_point(probe, starts[probe])
    index.learn_point(probe + 1, starts[probe + 1])
    assert index.entry_of(73_456) == 734


def test_a_ledger_of_one_record_per_entry_needs_no_probe() -> None:
    """Entry format 1 (or batches of one): the ends alone place every offset."""
    index = EntryIndex.closed(40, 10, 50)
    assert [index.entry_of(offset) for offset in range(40, 50)] == list(range(10))


def test_a_read_that_contradicts_the_index_is_refused() -> None:
    index = EntryIndex.closed(0, 10, 30)
    index.learn_point(4, 12)
    with pytest.raises(LedgerMetadataFormatError, match="starts at offset 13, not 12"):
        index.learn_point(4, 13)
    with pytest.raises(LedgerMetadataFormatError, match="out of place"):
        index.learn_point(5, 12)  # no record in entry 4
    with pytest.raises(LedgerMetadataFormatError, match="out of place"):
        index.learn_point(9, 29 + 1)  # entry 9 would hold nothing
    with pytest.raises(LedgerMetadataFormatError, match="outside"):
        index.learn_point(11, 31)


def test_truncate_forgets_a_tail_recovery_found_only_in_part() -> None:
    index = EntryIndex(10)
    index.append([2, 3, 4])
    index.truncate(2)
    assert (index.entry_count, index.end_offset) == (2, 15)
    assert index.entry_of(14) == 1
