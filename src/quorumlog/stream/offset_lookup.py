"""Offsets by time (Kafka's offsetsForTimes) without a time index on the nodes: a binary
search over a partition's retained records, one single-record fetch per step (so about
log2(records) round trips).

It assumes record timestamps do not go down within a partition, which holds for the
leader's stamps (records sent without a timestamp); records whose producer set earlier
stamps after later ones make the answer one of the offsets near the exact one.
"""

from __future__ import annotations

from quorumlog.stream.client_common import StreamTransport, leader_status
from quorumlog.stream.fetching import decode_records, fetch

SEARCH_STEPS_MAX = 80
"""More than the 63 halvings any 64-bit offset range needs."""


async def offset_for_time(
    transport: StreamTransport, topic: str, partition: int, timestamp_ms: int, bytes_max: int
) -> int | None:
    """The first offset whose record's timestamp is at or after `timestamp_ms`; None if
    no retained record is that late."""
    status = await leader_status(transport, topic, partition)
    low, high = status.begin_offset, status.end_offset
    for _ in range(SEARCH_STEPS_MAX):
        if low >= high:
            break
        middle = (low + high) // 2
        result = await fetch(transport, topic, partition, middle, 1, bytes_max, leader_only=True)
        records = decode_records(topic, partition, middle, result, 1)
        if not records or records[0].timestamp >= timestamp_ms:
            high = middle
        else:
            low = middle + 1
    return low if low < status.end_offset else None


__all__ = ["offset_for_time"]
