"""Offsets for times: the earliest offset of a partition whose record time is at least a
given time, as Kafka's `offsetsForTimes` answers it.

A record's time is its producer's (CreateTime) when set, else the partition leader's stamp
on its batch (LogAppendTime): the `timestamp` a consumer sees. The search runs on the
client over ordinary Fetch requests, one batch per probe, bisecting the partition's
offsets by the newest time in each probed batch. It needs nothing from the node, so it
works alike on every storage mode (Raft, ledger, HA) and costs about log2(records /
records per batch) round trips per partition.

Like Kafka's time index, the answer is exact when batch times never go backwards (leader
stamps, and producer times that rise); when producers set times out of order, it is an
offset whose batch holds a record at or after the time with every batch the bisection
looked at before it older, not necessarily the first such record in the whole log.

Shared by the Spark source (`startingTimestamp` and friends) and any client that wants
`offsets_for_times` (the Consumer).
"""

from __future__ import annotations

from collections.abc import Mapping

from quorumlog.errors import UnavailableError
from quorumlog.stream.client_common import OffsetOutOfRangeError, StreamTransport, leader_status
from quorumlog.stream.consumer import batch_decoder, fetch
from quorumlog.stream.fetching import batch_records

PROBE_RECORDS_MAX = 1
"""A probe asks for one record: the node answers with the one batch that holds it."""
PROBE_BYTES_MAX = 1


def first_at_or_after(times_ms: list[int], timestamp_ms: int) -> int | None:
    """The position of the first time at or after `timestamp_ms`, or None."""
    for position, time_ms in enumerate(times_ms):
        if time_ms >= timestamp_ms:
            return position
    return None


async def probe(
    transport: StreamTransport, topic: str, partition: int, offset: int
) -> tuple[int, list[int]]:
    """(base offset, record times) of the batch holding `offset`, read at the leader."""
    result = await fetch(
        transport, topic, partition, offset, PROBE_RECORDS_MAX, PROBE_BYTES_MAX, leader_only=True
    )
    if not result.batches:
        raise UnavailableError(
            f"{topic}/{partition}: no batch came back for offset {offset} "
            f"(the partition holds [{result.begin_offset}, {result.end_offset}))"
        )
    fetched = result.batches[0]
    batch = batch_decoder.decode(fetched.data)
    stamp = batch.timestamp_ms
    # batch_records: a compressed batch holds its records only in its compressed bytes.
    return fetched.base_offset, [record.timestamp_ms or stamp for record in batch_records(batch)]


async def offset_for_time(
    transport: StreamTransport,
    topic: str,
    partition: int,
    timestamp_ms: int,
    bounds: tuple[int, int] | None = None,
) -> int | None:
    """The earliest offset whose record time is at or after `timestamp_ms` (see the module
    docstring for out-of-order times), or None when every record is older (Kafka answers
    null then). `bounds` is the partition's [begin, end) if the caller has it."""
    if bounds is None:
        status = await leader_status(transport, topic, partition)
        bounds = (status.begin_offset, status.end_offset)
    low, high = bounds
    found: int | None = None
    # Invariant: every batch wholly below `low` is older than the time; the batch at
    # `high` (if any) holds the best answer seen so far, `found`.
    while low < high:
        middle = (low + high) // 2
        try:
            base_offset, times_ms = await probe(transport, topic, partition, middle)
        except OffsetOutOfRangeError as error:
            if error.begin_offset <= low or error.begin_offset >= high:
                raise
            low = error.begin_offset  # retention cut the head meanwhile: search what is left
            continue
        skip = max(low - base_offset, 0)
        position = first_at_or_after(times_ms[skip:], timestamp_ms)
        if position is None:
            low = max(base_offset + len(times_ms), middle + 1)
        else:
            found = base_offset + skip + position
            high = min(base_offset, middle)
    return found


async def offsets_for_times(
    transport: StreamTransport, timestamps_ms: Mapping[tuple[str, int], int]
) -> dict[tuple[str, int], int | None]:
    """`offset_for_time` of each (topic, partition), one after another."""
    return {
        (topic, partition): await offset_for_time(transport, topic, partition, timestamp_ms)
        for (topic, partition), timestamp_ms in timestamps_ms.items()
    }


__all__ = ["offset_for_time", "offsets_for_times"]
