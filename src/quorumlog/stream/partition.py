"""The state machine of one stream partition.

Records live in the Raft log itself; this machine keeps only what maps offsets to log
entries, and what makes producers idempotent:

- per applied batch, in packed arrays: its log index, base offset, record count, leader
  timestamp and size — about 40 bytes per batch, not per record;
- per producer id: the next expected sequence and its last few batches (a retried batch
  is answered with its original offsets, as Kafka's idempotent producer is).

Retention cuts the log at a batch boundary. What a follower that is behind the cut needs
is this machine's state *at the cut*, so the machine keeps checkpoints of its small state
every `checkpoint_entries` entries and a snapshot is always one of those checkpoints.
"""

from __future__ import annotations

import bisect
from array import array
from collections import OrderedDict

import msgspec

from quorumlog.errors import QuorumLogError

RECENT_BATCHES_PER_PRODUCER = 5
PRODUCER_COUNT_MAX_DEFAULT = 20_000
CHECKPOINT_ENTRIES_DEFAULT = 64
CHECKPOINTS_MAX = 64
"""Past this many, every other older checkpoint goes: retention needs one near the cut,
not all of them, and each holds a copy of the producer table."""


class OutOfOrderSequenceError(QuorumLogError):
    """A batch whose base sequence skips ahead of what its producer sent so far."""


class OffsetOutOfRangeError(QuorumLogError):
    """An offset below the first retained record or past the end of the partition."""

    def __init__(self, message: str, begin_offset: int, end_offset: int) -> None:
        super().__init__(message)
        self.begin_offset = begin_offset
        self.end_offset = end_offset


class BatchHeader(msgspec.Struct, frozen=True, array_like=True):
    """A RecordBatch decoded without building its records: apply needs only the count."""

    producer_id: str
    base_sequence: int
    timestamp_ms: int
    records: list[msgspec.Raw]
    compression: str = "none"
    compressed: msgspec.Raw = msgspec.Raw(b"")
    record_count: int = -1

    @property
    def count(self) -> int:
        """Records in the batch: listed, or (compressed) as the batch says."""
        return len(self.records) if self.compression == "none" else self.record_count


class ProducerState(msgspec.Struct, array_like=True):
    next_sequence: int = 0
    recent: list[tuple[int, int, int]] = []
    """(base sequence, count, base offset) of its last batches."""


class ProduceOutcome(msgspec.Struct, frozen=True):
    base_offset: int
    count: int
    duplicate: bool = False


class Checkpoint(msgspec.Struct, frozen=True, array_like=True):
    """The machine's small state right after applying log index `index`."""

    index: int
    next_offset: int
    producers: list[tuple[str, ProducerState]]


_header_decoder = msgspec.msgpack.Decoder(BatchHeader)
_checkpoint_encoder = msgspec.msgpack.Encoder()
_checkpoint_decoder = msgspec.msgpack.Decoder(Checkpoint)


class PartitionMachine:
    def __init__(
        self,
        producer_count_max: int = PRODUCER_COUNT_MAX_DEFAULT,
        checkpoint_entries: int = CHECKPOINT_ENTRIES_DEFAULT,
    ) -> None:
        self.producer_count_max = producer_count_max
        self.checkpoint_entries = checkpoint_entries
        self.reset(Checkpoint(index=0, next_offset=0, producers=[]))

    def reset(self, checkpoint: Checkpoint) -> None:
        self.applied_index = checkpoint.index
        self.next_offset = checkpoint.next_offset
        self.begin_offset = checkpoint.next_offset
        self.producers: OrderedDict[str, ProducerState] = OrderedDict(
            (producer_id, state) for producer_id, state in checkpoint.producers
        )
        self.batch_indexes = array("q")
        self.batch_offsets = array("q")
        self.batch_counts = array("q")
        self.batch_timestamps_ms = array("q")
        self.batch_bytes = array("q")
        self.retained_bytes = 0
        """sum(batch_bytes), kept as batches come and go (retention checks it each second)."""
        self.checkpoints: list[Checkpoint] = [checkpoint]
        self.entries_since_checkpoint = 0

    # --- apply --------------------------------------------------------------------------

    def apply(self, index: int, data: bytes) -> ProduceOutcome | QuorumLogError:
        """Apply the batch in log entry `index`. Errors are returned, not raised: a refused
        batch is a normal outcome that every replica reaches the same way."""
        if index <= self.applied_index:
            return ProduceOutcome(base_offset=-1, count=0, duplicate=True)
        header = _header_decoder.decode(data)
        outcome = self.admit(header)
        if isinstance(outcome, ProduceOutcome) and not outcome.duplicate:
            self.batch_indexes.append(index)
            self.batch_offsets.append(outcome.base_offset)
            self.batch_counts.append(outcome.count)
            self.batch_timestamps_ms.append(header.timestamp_ms)
            self.batch_bytes.append(len(data))
            self.retained_bytes += len(data)
        self.mark_applied(index)
        return outcome

    def mark_applied(self, index: int) -> None:
        """Entries without records (no-ops, configuration) still move the checkpoint clock."""
        if index <= self.applied_index:
            return
        self.applied_index = index
        self.entries_since_checkpoint += 1
        if self.entries_since_checkpoint >= self.checkpoint_entries:
            self.take_checkpoint()

    def admit(self, header: BatchHeader) -> ProduceOutcome | QuorumLogError:
        outcome = admit_batch(
            self.producers,
            header.producer_id,
            header.base_sequence,
            header.count,
            self.next_offset,
            self.producer_count_max,
        )
        if isinstance(outcome, ProduceOutcome) and not outcome.duplicate:
            self.next_offset += outcome.count
        return outcome

    # --- checkpoints, snapshots, retention ----------------------------------------------

    def take_checkpoint(self) -> None:
        self.entries_since_checkpoint = 0
        producers = [
            (producer_id, ProducerState(state.next_sequence, list(state.recent)))
            for producer_id, state in self.producers.items()
        ]
        self.checkpoints.append(
            Checkpoint(index=self.applied_index, next_offset=self.next_offset, producers=producers)
        )
        if len(self.checkpoints) > CHECKPOINTS_MAX:
            half = len(self.checkpoints) // 2
            # Keep the oldest (the state at the current cut) and thin the older half.
            self.checkpoints = (
                self.checkpoints[:1] + self.checkpoints[2:half:2] + (self.checkpoints[half:])
            )

    def checkpoint_at_or_below(self, index: int) -> Checkpoint:
        position = bisect.bisect_right([c.index for c in self.checkpoints], index) - 1
        return self.checkpoints[max(position, 0)]

    def snapshot(self) -> bytes:
        """The newest checkpoint (a snapshot never covers records still retained)."""
        return _checkpoint_encoder.encode(self.checkpoints[-1])

    def encode_checkpoint(self, checkpoint: Checkpoint) -> bytes:
        return _checkpoint_encoder.encode(checkpoint)

    def restore(self, data: bytes) -> None:
        self.reset(_checkpoint_decoder.decode(data))

    def retention_cut(
        self, now_ms: int, retention_bytes: int, retention_ms: int
    ) -> Checkpoint | None:
        """The newest checkpoint such that every record below it may go, or None.

        A batch may go when the retained bytes exceed `retention_bytes` without it, or its
        leader timestamp is older than `retention_ms` (-1 disables either rule)."""
        count = len(self.batch_indexes)
        if count == 0:
            return None
        drop = 0
        if retention_bytes >= 0:
            retained = self.retained_bytes
            while drop < count and retained > retention_bytes:
                retained -= self.batch_bytes[drop]
                drop += 1
        if retention_ms >= 0:
            limit_ms = now_ms - retention_ms
            while drop < count and self.batch_timestamps_ms[drop] < limit_ms:
                drop += 1
        if drop == 0:
            return None
        # Everything up to the last dropped batch's log index may go; cut at a checkpoint.
        checkpoint = self.checkpoint_at_or_below(self.batch_indexes[drop - 1])
        if checkpoint.index < (self.batch_indexes[0] if count else 0):
            return None
        return checkpoint

    def forget_below(self, checkpoint: Checkpoint) -> None:
        """The log was cut after `checkpoint.index`: drop what pointed into the cut part."""
        keep = bisect.bisect_right(self.batch_indexes, checkpoint.index)
        self.retained_bytes -= sum(self.batch_bytes[:keep])
        for column in (
            self.batch_indexes,
            self.batch_offsets,
            self.batch_counts,
            self.batch_timestamps_ms,
            self.batch_bytes,
        ):
            del column[:keep]
        self.begin_offset = checkpoint.next_offset
        self.checkpoints = [c for c in self.checkpoints if c.index >= checkpoint.index]

    # --- reads --------------------------------------------------------------------------

    def locate(self, offset: int) -> int:
        """The position (in the batch arrays) of the batch holding `offset`, or of the
        first batch after it; len(batches) when `offset` is the end."""
        if offset < self.begin_offset or offset > self.next_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{self.begin_offset}, {self.next_offset}]",
                self.begin_offset,
                self.next_offset,
            )
        position = bisect.bisect_right(self.batch_offsets, offset) - 1
        return max(position, 0)

    def batches_from(self, offset: int, records_max: int, bytes_max: int) -> list[tuple[int, int]]:
        """(log index, base offset) of the batches that cover records from `offset` on."""
        position = self.locate(offset)
        found: list[tuple[int, int]] = []
        records = 0
        size = 0
        while position < len(self.batch_indexes) and records < records_max:
            base = self.batch_offsets[position]
            if base + self.batch_counts[position] > offset:
                found.append((self.batch_indexes[position], base))
                records += base + self.batch_counts[position] - max(base, offset)
                size += self.batch_bytes[position]
                if size >= bytes_max:
                    break
            position += 1
        return found


def admit_batch(
    producers: OrderedDict[str, ProducerState],
    producer_id: str,
    base_sequence: int,
    count: int,
    next_offset: int,
    producer_count_max: int,
) -> ProduceOutcome | QuorumLogError:
    """Decide one producer batch against the producer table: new (written at `next_offset`;
    the table moves on, the caller moves its offset), a duplicate (the original offsets,
    or -1 if no longer remembered) or out of order. Shared by every storage mode (Raft
    partitions here, managed ledgers in ledger/managed.py), so they answer alike."""
    state = producers.get(producer_id)
    if state is None:
        state = ProducerState()
        producers[producer_id] = state
        while len(producers) > producer_count_max:
            producers.popitem(last=False)  # least recently active, same everywhere
    else:
        producers.move_to_end(producer_id)
    if base_sequence == state.next_sequence:
        state.next_sequence += count
        state.recent.append((base_sequence, count, next_offset))
        del state.recent[:-RECENT_BATCHES_PER_PRODUCER]
        return ProduceOutcome(base_offset=next_offset, count=count)
    if base_sequence < state.next_sequence:
        for recent_sequence, recent_count, base_offset in state.recent:
            if recent_sequence == base_sequence and recent_count == count:
                return ProduceOutcome(base_offset=base_offset, count=count, duplicate=True)
        if base_sequence + count <= state.next_sequence:
            # Written long ago (a replay, as a restarted Spark task sends): not written
            # again. Its offsets are no longer remembered, so the answer says -1, as
            # Kafka answers DUPLICATE_SEQUENCE_NUMBER.
            return ProduceOutcome(base_offset=-1, count=count, duplicate=True)
        return OutOfOrderSequenceError(
            f"producer {producer_id}: batch at sequence {base_sequence} of "
            f"{count} records straddles the next expected sequence {state.next_sequence}"
        )
    return OutOfOrderSequenceError(
        f"producer {producer_id}: out of order sequence {base_sequence}, "
        f"expected {state.next_sequence}"
    )
