"""CRC32C (Castagnoli) through google-crc32c's C implementation.

One function per use so the hot paths call straight into C without wrappers of their own.
"""

from __future__ import annotations

import google_crc32c

_value = google_crc32c.value
_extend = google_crc32c.extend


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """The CRC32C of `data`, as an unsigned 32-bit integer."""
    return int(_value(data))


def crc32c_extend(crc: int, data: bytes | bytearray | memoryview) -> int:
    """Continue a running CRC32C `crc` over `data`."""
    return int(_extend(crc, data))
