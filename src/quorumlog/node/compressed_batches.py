"""The checks a node makes on a compressed produce before it logs the batch as it came.

A node does not recompress or rewrite: the log keeps the producer's compressed bytes. So
it checks them once, here, as it checks an uncompressed batch's records by decoding
them: a known codec, a payload that decompresses within bounds into exactly
`record_count` well-formed records, and the same record and byte limits.
"""

from __future__ import annotations

import msgspec

from quorumlog.codec import wire
from quorumlog.codec.compression import CODECS, NONE, CompressionError, decompress

_records_decoder = msgspec.msgpack.Decoder(list[wire.Record])
DECODE_OR_DECOMPRESS_ERRORS: tuple[type[Exception], ...] = (CompressionError, *wire.DECODE_ERRORS)


def compressed_batch_problem(
    request: wire.Produce, records_max: int, bytes_max: int
) -> tuple[wire.ErrorCode, str] | None:
    """Why the compressed batch in `request` is refused; None if it is sound."""
    if request.compression not in CODECS or request.compression == NONE:
        return wire.ErrorCode.BAD_REQUEST, f"unknown compression {request.compression!r}"
    if request.records:
        return wire.ErrorCode.BAD_REQUEST, "a compressed batch carries no plain records"
    if not 1 <= request.record_count <= records_max or len(request.compressed) > bytes_max:
        return (
            wire.ErrorCode.TOO_LARGE,
            f"{request.record_count} records in {len(request.compressed)} compressed bytes; "
            f"1 to {records_max} records and at most {bytes_max} bytes per batch",
        )
    try:
        records = _records_decoder.decode(decompress(request.compression, request.compressed))
    except DECODE_OR_DECOMPRESS_ERRORS as error:
        return wire.ErrorCode.BAD_REQUEST, f"the compressed records do not decode: {error}"
    if len(records) != request.record_count:
        return (
            wire.ErrorCode.BAD_REQUEST,
            f"the batch says {request.record_count} records and holds {len(records)}",
        )
    size = sum(len(r.value or b"") + len(r.key or b"") for r in records)
    if size > bytes_max:
        return wire.ErrorCode.TOO_LARGE, f"{size} bytes of records; at most {bytes_max}"
    return None


__all__ = ["compressed_batch_problem"]
