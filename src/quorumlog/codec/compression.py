"""Compression of record batches: a producer compresses each batch's records once, the
log keeps the compressed bytes as they came, and readers decompress.

The codec is recorded in the batch (`wire.RecordBatch.compression`): "none" (records
stored as they are; every batch written before compression existed reads as this),
"zstd" (Zstandard, the `zstandard` package) or "lz4" (LZ4 frames, the `lz4` package).
The packages load on first use, so nothing else pays for them.
"""

from __future__ import annotations

from quorumlog.errors import QuorumLogError

NONE = "none"
ZSTD = "zstd"
LZ4 = "lz4"
CODECS = (NONE, ZSTD, LZ4)
DECOMPRESSED_BYTES_MAX = 64 * 1024 * 1024
"""More than any batch a node accepts (32 MiB of keys and values): a compressed payload
that would grow past this is refused, not inflated."""
ZSTD_LEVEL = 3
"""zstd's own default: most of the ratio at a fraction of the higher levels' time."""


class CompressionError(QuorumLogError, ValueError):
    """An unknown codec, or a payload that does not decompress (or decompresses to more
    than DECOMPRESSED_BYTES_MAX)."""


def compress(codec: str, data: bytes) -> bytes:
    if codec == ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
    if codec == LZ4:
        import lz4.frame  # type: ignore[import-untyped]

        compressed: bytes = lz4.frame.compress(data, store_size=True)
        return compressed
    raise CompressionError(f"the compression is one of {', '.join(CODECS[1:])}, not {codec!r}")


def decompress(codec: str, data: bytes) -> bytes:
    """The original bytes; CompressionError if they cannot be had within the bound."""
    if codec == ZSTD:
        import zstandard

        try:
            output: bytes = zstandard.ZstdDecompressor().decompress(
                data, max_output_size=DECOMPRESSED_BYTES_MAX + 1
            )
        except zstandard.ZstdError as error:
            raise CompressionError(f"a zstd payload does not decompress: {error}") from error
    elif codec == LZ4:
        import lz4.frame

        try:
            decompressor = lz4.frame.LZ4FrameDecompressor()
            output = decompressor.decompress(data, max_length=DECOMPRESSED_BYTES_MAX + 1)
        except RuntimeError as error:  # what lz4 raises for a bad frame
            raise CompressionError(f"an lz4 payload does not decompress: {error}") from error
    else:
        raise CompressionError(f"unknown compression {codec!r}")
    if len(output) > DECOMPRESSED_BYTES_MAX:
        raise CompressionError(f"a {codec} payload grows past {DECOMPRESSED_BYTES_MAX} bytes")
    return output


__all__ = ["CODECS", "LZ4", "NONE", "ZSTD", "CompressionError", "compress", "decompress"]
