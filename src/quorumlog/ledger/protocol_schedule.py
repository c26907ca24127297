"""Striping and quorums: which positions of an ensemble hold an entry, when an entry counts
as acknowledged, and when a fence covers the ledger.

Positions, not bookie ids: position p is the p-th bookie of a fragment's ensemble. Entry e
goes to the write set of Qw consecutive positions starting at e mod E (reference 001: with
E=3, Qw=2 entry 0 -> 0,1; entry 1 -> 1,2; entry 2 -> 2,0).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Sequence
from itertools import chain
from typing import TypeVar

Item = TypeVar("Item")
Picker = Callable[[Sequence[Item]], list[Item]]

_SHARE_PICKERS_MAX = 256
"""Cached striping pickers (one per position, residue and batch size seen)."""


class DistributionSchedule:
    def __init__(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
        if not 1 <= ack_quorum_size <= write_quorum_size <= ensemble_size:
            raise ValueError("sizes must satisfy 1 <= ack quorum <= write quorum <= ensemble")
        self.ensemble_size = ensemble_size
        self.write_quorum_size = write_quorum_size
        self.ack_quorum_size = ack_quorum_size
        self.fence_quorum_size = write_quorum_size - ack_quorum_size + 1
        """Qf: bookies of a write set that must be fenced (or must say "not here") so the
        other Qw - Qf = Qa - 1 can never make up an ack quorum."""
        self.write_sets: list[tuple[int, ...]] = [
            tuple((first + k) % ensemble_size for k in range(write_quorum_size))
            for first in range(ensemble_size)
        ]
        self.sorted_write_sets: list[tuple[int, ...]] = [
            tuple(sorted(write_set)) for write_set in self.write_sets
        ]
        self.holds_by_residue: list[tuple[bool, ...]] = [
            tuple(position in write_set for position in range(ensemble_size))
            for write_set in self.write_sets
        ]
        """[e mod E][p]: whether position p holds entries e with that residue."""
        self.share_pickers: dict[tuple[int, int, int], Picker[object]] = {}

    def write_set(self, entry_id: int) -> tuple[int, ...]:
        return self.write_sets[entry_id % self.ensemble_size]

    def holds(self, position: int, entry_id: int) -> bool:
        return self.holds_by_residue[entry_id % self.ensemble_size][position]

    def fence_covered(self, fenced_positions: Collection[int]) -> bool:
        """True once every write set has at least Qf fenced positions: then no write set
        has Qa unfenced bookies left, so the old writer cannot complete any add."""
        need = self.fence_quorum_size
        return all(
            sum(1 for position in write_set if position in fenced_positions) >= need
            for write_set in self.write_sets
        )

    def acknowledged_frontier(self, watermarks: Sequence[int], last_add_confirmed: int) -> int:
        """The new LAC: the highest entry id such that it and every entry after
        `last_add_confirmed` have Qa acks.

        `watermarks[p]` says position p has durably stored every entry of its share up to
        and including that id. Entry e is then acknowledged by position p exactly when p is
        in e's write set and watermarks[p] >= e, so for each residue r of e mod E the
        highest acknowledged entry is bounded by the Qa-th largest watermark in write set
        r. The first entry after the LAC that misses its quorum, over all residues, ends the
        run. Work per call: O(E * Qw), independent of how many entries are in flight.
        """
        ensemble_size = self.ensemble_size
        ack_quorum_size = self.ack_quorum_size
        first_misses = []
        for residue, write_set in enumerate(self.write_sets):
            marks = sorted((watermarks[position] for position in write_set), reverse=True)
            quorum_mark = max(marks[ack_quorum_size - 1], last_add_confirmed)
            # The smallest entry of this residue above quorum_mark: the residue's first miss.
            candidate = quorum_mark + 1
            first_misses.append(candidate + (residue - candidate) % ensemble_size)
        return min(first_misses) - 1

    def share(self, position: int, first_entry_id: int, batch: Sequence[Item]) -> list[Item]:
        """The items of `batch` (entries first_entry_id, first_entry_id + 1, ...) that
        `position` holds. The picking runs in C (an itemgetter), cached per (position, first
        entry mod E, batch size): batches mostly come in a few sizes."""
        if self.ensemble_size == self.write_quorum_size:
            return list(batch)
        key = (position, first_entry_id % self.ensemble_size, len(batch))
        pick = self.share_pickers.get(key)
        if pick is None:
            if len(self.share_pickers) >= _SHARE_PICKERS_MAX:
                self.share_pickers.clear()
            offsets = self.share_offsets(position, first_entry_id, len(batch))
            pick = self.share_pickers[key] = share_picker(offsets)
        return pick(batch)  # type: ignore[return-value]  # the picker keeps the item type

    def share_offsets(self, position: int, first_entry_id: int, count: int) -> list[int]:
        """The offsets k in 0..count-1 of the entries first_entry_id + k that `position`
        holds, in order: one stride of E per residue it holds, merged. Built from ranges
        and one sort in C, because batch sizes vary (each new size builds a picker, and a
        test of every offset in Python cost about as much as the rest of a send)."""
        ensemble_size = self.ensemble_size
        strides = [
            range((residue - first_entry_id) % ensemble_size, count, ensemble_size)
            for residue, holds in enumerate(self.holds_by_residue)
            if holds[position]
        ]
        return sorted(chain.from_iterable(strides))


def share_picker(offsets: list[int]) -> Picker[object]:
    if not offsets:
        return lambda batch: []
    if len(offsets) == 1:
        only = offsets[0]
        return lambda batch: [batch[only]]
    getter = operator.itemgetter(*offsets)
    return lambda batch: list(getter(batch))
