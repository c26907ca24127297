"""The HA channel's frames round-trip through their own codec; junk is a decode error."""

from __future__ import annotations

import msgspec
import pytest

from quorumlog.ha.epoch_file import EpochEntry
from quorumlog.ha.wire import (
    Ack,
    HAFrame,
    HandshakeRequest,
    HandshakeResponse,
    TransferBatch,
    decode_frame,
    encode_frame,
)

FRAMES: list[HAFrame] = [
    HandshakeRequest("b2", "127.0.0.1:7000", False, 3, 64 * 1024 * 1024),
    HandshakeResponse("b1", 3, 4096, 0, [EpochEntry(1, 0), EpochEntry(3, 2048)]),
    HandshakeResponse("b1", 3, 0, 0, [], refused="stale"),
    TransferBatch(3, 2048, 2048, 2400, 2048, [b"one", b"\x00two"]),
    TransferBatch(3, 2048, 2400, 2400, 2400, []),
    Ack(2400),
]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda frame: type(frame).__name__)
def test_frames_round_trip(frame: HAFrame) -> None:
    assert decode_frame(encode_frame(frame)) == frame


def test_a_malformed_frame_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_frame(b"\x93\xa6ha_ack")
