"""Wire and disk formats: checksums, entry headers, frames."""

from quorumlog.codec.checksum import crc32c, crc32c_extend

__all__ = ["crc32c", "crc32c_extend"]
