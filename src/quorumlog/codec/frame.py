"""Length-prefixed frames: a 4-byte big-endian payload length, then the payload.

The length is checked against `frame_bytes_max` before any payload byte is buffered, so a
peer announcing a huge frame costs us four bytes, not memory.
"""

from __future__ import annotations

import struct

from quorumlog.errors import QuorumLogError

FRAME_HEADER = struct.Struct(">I")
FRAME_HEADER_BYTES = FRAME_HEADER.size
FRAME_BYTES_MAX_DEFAULT = 64 * 1024 * 1024


class FrameError(QuorumLogError):
    """A frame that breaks the framing rules (too large, or malformed)."""


def encode_frame(payload: bytes, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> bytes:
    if len(payload) > frame_bytes_max:
        raise FrameError(f"frame of {len(payload)} bytes exceeds frame_bytes_max={frame_bytes_max}")
    return FRAME_HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Feed bytes as they arrive; take out whole payloads."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        self.frame_bytes_max = frame_bytes_max
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Append `data`; return every complete payload now buffered, in order.

        Raises FrameError on a length over the bound; the connection must then be closed.
        """
        self.buffer += data
        payloads: list[bytes] = []
        position = 0
        buffer = self.buffer
        available = len(buffer)
        if available < FRAME_HEADER_BYTES:
            return payloads
        # Payloads are cut through a memoryview: one copy each, not a bytearray slice and
        # then a bytes copy of it (large frames, such as shard pulls, pay for every copy).
        # The view must be released before the buffer can shrink.
        with memoryview(buffer) as view:
            while available - position >= FRAME_HEADER_BYTES:
                (length,) = FRAME_HEADER.unpack_from(buffer, position)
                if length > self.frame_bytes_max:
                    raise FrameError(
                        f"peer announced a frame of {length} bytes; frame_bytes_max="
                        f"{self.frame_bytes_max}"
                    )
                end = position + FRAME_HEADER_BYTES + length
                if end > available:
                    break
                payloads.append(bytes(view[position + FRAME_HEADER_BYTES : end]))
                position = end
        if position:
            del buffer[:position]
        return payloads
