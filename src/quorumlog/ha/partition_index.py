"""An HA-replicated partition's records in a broker's commit log: the message format, and
the master's in-memory index from record offsets to log byte offsets with the producer table.

One produce batch is one commit log message (explicit layout, little-endian)::

    base_offset u64, record_count u32, then the encoded `wire.RecordBatch`

The record batch holds the producer id and base sequence (idempotence) and the master's
timestamp; its bytes are what a fetch returns, unchanged (as a Raft partition returns its
entries). The base offset is assigned by the master when it admits the batch, so consumers
see contiguous record numbers, as on Raft topics, and a slave that becomes master knows
every message's offsets from its log alone.

The index is built by reading the log once (`catch_up`: a slave indexes what it receives as
it goes, a step at a time, so becoming master reads only the last few messages) and extended
by the master's own appends. A truncation cuts
records whose producer-table effects cannot be undone, so it empties the index and the
table (`reset`); the next `catch_up` reads the log again from its start.
"""

from __future__ import annotations

import bisect
import struct
from collections import OrderedDict

import msgspec

from quorumlog.errors import QuorumLogError
from quorumlog.ha.commit_log import CommitLog
from quorumlog.raft.invariants import require
from quorumlog.stream.partition import (
    PRODUCER_COUNT_MAX_DEFAULT,
    OffsetOutOfRangeError,
    ProduceOutcome,
    ProducerState,
    admit_batch,
)

MESSAGE_HEADER = struct.Struct("<QI")


class RecordBatchHead(msgspec.Struct, frozen=True, array_like=True):
    """The leading fields of an encoded `wire.RecordBatch`: all that indexing needs (a
    full decode of a batch of 10,000 records cost a slave 15x a decode of its head, and a
    slave indexes every batch it receives)."""

    producer_id: str
    base_sequence: int


_head_decoder = msgspec.msgpack.Decoder(RecordBatchHead)
_FIXARRAY_OF_TWO = b"\x92"
_STRING_LENGTH_BYTES = {0xD9: 1, 0xDA: 2, 0xDB: 4}
"""msgpack str8 / str16 / str32: how many bytes of length follow the tag."""
_INTEGER_BYTES = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
"""msgpack uint8..uint64 and int8..int64: how many bytes follow the tag."""


def decode_batch_head(data: bytes | memoryview) -> RecordBatchHead:
    """The producer id and base sequence of an encoded record batch, read from the first
    bytes only: the batch is a msgpack array whose first two items are those fields, so
    they are re-framed as an array of two and decoded (checked) by msgspec, without
    scanning the records. Anything unexpected is decoded whole instead (msgspec.DecodeError,
    a ValueError, if it is malformed)."""
    end = _head_end(data)
    if end is None:
        return _head_decoder.decode(data)
    return _head_decoder.decode(_FIXARRAY_OF_TWO + bytes(data[1:end]))


def _head_end(data: bytes | memoryview) -> int | None:
    """Where the second item of the array `data` ends, or None if the layout is not
    a fixarray of at least two items led by a string and an integer."""
    if len(data) < 3 or not 0x92 <= data[0] <= 0x9F:
        return None
    tag = data[1]
    if 0xA0 <= tag <= 0xBF:
        string_end = 2 + (tag & 0x1F)
    elif tag in _STRING_LENGTH_BYTES:
        length_bytes = _STRING_LENGTH_BYTES[tag]
        string_end = 2 + length_bytes + int.from_bytes(data[2 : 2 + length_bytes], "big")
    else:
        return None
    if string_end >= len(data):
        return None
    tag = data[string_end]
    if tag <= 0x7F or tag >= 0xE0:  # a positive or negative fixint
        end = string_end + 1
    elif tag in _INTEGER_BYTES:
        end = string_end + 1 + _INTEGER_BYTES[tag]
    else:
        return None
    return end if end <= len(data) else None


def encode_message(base_offset: int, count: int, batch: bytes) -> bytes:
    return MESSAGE_HEADER.pack(base_offset, count) + batch


def decode_message(message: bytes) -> tuple[int, int, bytes]:
    """(base offset, record count, encoded record batch)."""
    base_offset, count = MESSAGE_HEADER.unpack_from(message)
    return base_offset, count, message[MESSAGE_HEADER.size :]


class HAPartitionIndex:
    def __init__(self, producer_count_max: int = PRODUCER_COUNT_MAX_DEFAULT) -> None:
        self.producer_count_max = producer_count_max
        self.reset()

    def reset(self) -> None:
        self.base_offsets: list[int] = []
        self.starts: list[int] = []
        """Log offset where each message starts (the previous one's end)."""
        self.ends: list[int] = []
        self.producers: OrderedDict[str, ProducerState] = OrderedDict()
        self.next_offset = 0
        """The record offset the next admitted batch gets."""
        self.indexed_end: int | None = None
        """The log offset up to which messages are indexed (None: nothing read yet)."""

    # --- building --------------------------------------------------------------------------

    def catch_up(self, log: CommitLog, messages_max: int | None = None) -> int:
        """Index the messages past `indexed_end` (at most `messages_max`); returns how many."""
        offset = log.min_offset if self.indexed_end is None else self.indexed_end
        self.indexed_end = offset
        count = 0
        while offset < log.max_offset and (messages_max is None or count < messages_max):
            batch = log.read_batch(offset, 1)  # one message: its end is its boundary
            require(batch is not None and len(batch.messages) == 1, f"no message at {offset}")
            assert batch is not None
            message = batch.messages[0]
            base_offset, records = MESSAGE_HEADER.unpack_from(message)
            header = decode_batch_head(memoryview(message)[MESSAGE_HEADER.size :])
            if not self.base_offsets:
                self.next_offset = base_offset  # a log that starts later (retention)
            require(
                base_offset == self.next_offset,
                f"message at log offset {offset} starts at record {base_offset}, "
                f"expected {self.next_offset}",
            )
            admit_batch(
                self.producers,
                header.producer_id,
                header.base_sequence,
                records,
                base_offset,
                self.producer_count_max,
            )
            self.appended(offset, batch.end_offset, base_offset, records)
            offset = batch.end_offset
            count += 1
        return count

    def admit(
        self, producer_id: str, base_sequence: int, count: int
    ) -> ProduceOutcome | QuorumLogError:
        """Decide a produce (new at `next_offset`, a duplicate, or out of order). A new one
        must then be appended and `appended` called, before anything else is admitted."""
        return admit_batch(
            self.producers,
            producer_id,
            base_sequence,
            count,
            self.next_offset,
            self.producer_count_max,
        )

    def appended(self, start: int, end: int, base_offset: int, count: int) -> None:
        require(
            self.indexed_end == start and base_offset == self.next_offset,
            f"message [{start}, {end}) of records from {base_offset} does not follow "
            f"log offset {self.indexed_end}, record {self.next_offset}",
        )
        self.base_offsets.append(base_offset)
        self.starts.append(start)
        self.ends.append(end)
        self.next_offset = base_offset + count
        self.indexed_end = end

    # --- reading ---------------------------------------------------------------------------

    @property
    def begin_offset(self) -> int:
        return self.base_offsets[0] if self.base_offsets else self.next_offset

    def end_of_records(self, base_offset: int) -> int | None:
        """The log end offset of the message whose records start at `base_offset`."""
        position = bisect.bisect_left(self.base_offsets, base_offset)
        if position < len(self.base_offsets) and self.base_offsets[position] == base_offset:
            return self.ends[position]
        return None

    def confirmed_count(self, confirm_offset: int) -> int:
        """How many messages end at or below `confirm_offset`."""
        return bisect.bisect_right(self.ends, confirm_offset)

    def confirmed_end(self, confirm_offset: int) -> int:
        """The record offset after the last record of a message ending by `confirm_offset`."""
        position = self.confirmed_count(confirm_offset)
        if position == 0:
            return self.begin_offset
        if position == len(self.base_offsets):
            return self.next_offset
        return self.base_offsets[position]

    def locate(self, record_offset: int, confirm_offset: int) -> int:
        """The position of the message holding `record_offset` (the count of confirmed
        messages at the end). OffsetOutOfRangeError outside [begin, confirmed end]."""
        end = self.confirmed_end(confirm_offset)
        if not self.begin_offset <= record_offset <= end:
            raise OffsetOutOfRangeError(
                f"offset {record_offset} is outside [{self.begin_offset}, {end}]",
                self.begin_offset,
                end,
            )
        return max(0, bisect.bisect_right(self.base_offsets, record_offset) - 1)


__all__ = [
    "MESSAGE_HEADER",
    "HAPartitionIndex",
    "RecordBatchHead",
    "decode_batch_head",
    "decode_message",
    "encode_message",
]
