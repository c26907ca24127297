"""Length-prefixed framing: payloads come out whole and in order however the bytes are cut,
and a frame announced over the bound is refused before its payload is buffered."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorumlog.codec.frame import (
    COLLECT_BYTES_MIN,
    FRAME_HEADER,
    FrameDecoder,
    FrameError,
    encode_frame,
)


# Generating up to 36 KB per example is slow on a loaded machine: that is not a failure.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    payloads=st.lists(st.binary(max_size=3000), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=40_000), max_size=20),
)
def test_payloads_come_out_whole_and_in_order_however_the_stream_is_cut(
    payloads: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(encode_frame(payload) for payload in payloads)
    points = sorted({cut for cut in cuts if cut < len(stream)} | {0, len(stream)})
    decoder = FrameDecoder()
    received: list[bytes] = []
    for start, end in itertools.pairwise(points):
        received.extend(decoder.feed(stream[start:end]))
    assert received == payloads
    assert decoder.buffer == bytearray()


def test_a_large_frame_fed_in_pieces_comes_out_once_complete() -> None:
    payload = bytes(range(256)) * (4 * 4096 + 1)  # just over 4 MiB
    frame = encode_frame(payload) + encode_frame(b"next")
    decoder = FrameDecoder()
    out: list[bytes] = []
    for start in range(0, len(frame), 256 * 1024):
        out.extend(decoder.feed(frame[start : start + 256 * 1024]))
    assert out == [payload, b"next"]


# Large payloads (collected piece by piece) between small ones, cut anywhere: inside a
# header, at a frame's last byte, several frames in one piece.
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(
        st.sampled_from([0, 7, COLLECT_BYTES_MIN - 1, COLLECT_BYTES_MIN, 3 * COLLECT_BYTES_MIN]),
        min_size=1,
        max_size=6,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=7 * COLLECT_BYTES_MIN), max_size=40),
)
def test_large_frames_collected_in_pieces_come_out_whole_and_in_order(
    sizes: list[int], cuts: list[int]
) -> None:
    payloads = [bytes([number]) * size for number, size in enumerate(sizes)]
    stream = b"".join(encode_frame(payload) for payload in payloads)
    points = sorted({cut for cut in cuts if cut < len(stream)} | {0, len(stream)})
    decoder = FrameDecoder()
    received: list[bytes] = []
    for start, end in itertools.pairwise(points):
        received.extend(decoder.feed(stream[start:end]))
    assert received == payloads
    assert decoder.buffer == bytearray()
    assert decoder.missing_bytes == 0


def test_a_large_frame_is_not_grown_in_one_buffer_while_it_arrives() -> None:
    # Growing one buffer 64 KiB at a time cost 3 ms per 1.3 MB frame (reallocations);
    # the pieces are kept as they came and joined once.
    payload = b"x" * 1_300_000
    frame = encode_frame(payload)
    decoder = FrameDecoder()
    out: list[bytes] = []
    for start in range(0, len(frame), 64 * 1024):
        out.extend(decoder.feed(frame[start : start + 64 * 1024]))
        assert len(decoder.buffer) < COLLECT_BYTES_MIN
    assert out == [payload]


def test_an_oversized_frame_is_refused_from_its_header() -> None:
    decoder = FrameDecoder(frame_bytes_max=1024)
    with pytest.raises(FrameError, match="1025 bytes"):
        decoder.feed(FRAME_HEADER.pack(1025) + b"x")
    with pytest.raises(FrameError):
        encode_frame(b"x" * 1025, frame_bytes_max=1024)
