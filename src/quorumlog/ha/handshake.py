"""Where a slave's log parts from its master's: reference 003's truncation algorithm.

Compare the two epoch lists from the back (newest epoch first, the slave's list driving):
the first epoch of the slave's that the master also has, with the same start offset, is
valid on both sides; the logs agree up to the smaller of the two ends of that epoch's range.
Everything after that point on the slave goes.

Why that is right: one MasterEpoch has one master (the controller issues each once), so two
brokers holding messages of epoch E both hold a prefix of what E's master wrote from E's
start. The same start offset means the same history before E too: a broker records
<E, start> only once its log runs up to `start` in agreement with E's master.

No match (the slave's list is empty, or every epoch differs) means nothing can be trusted:
the slave truncates to the start of its log.
"""

from __future__ import annotations

from collections.abc import Sequence

from quorumlog.ha.epoch_file import EpochEntry, epoch_ranges


def find_consistent_point(
    slave_epochs: Sequence[EpochEntry],
    slave_max_offset: int,
    master_epochs: Sequence[EpochEntry],
    master_max_offset: int,
) -> int | None:
    """The offset up to which the slave's log agrees with the master's, or None if no
    epoch matches (then the slave keeps nothing)."""
    master_ranges = {
        item.epoch: item for item in epoch_ranges(list(master_epochs), master_max_offset)
    }
    for slave_range in reversed(epoch_ranges(list(slave_epochs), slave_max_offset)):
        master_range = master_ranges.get(slave_range.epoch)
        if master_range is not None and master_range.start_offset == slave_range.start_offset:
            return min(slave_range.end_offset, master_range.end_offset)
    return None


__all__ = ["find_consistent_point"]
