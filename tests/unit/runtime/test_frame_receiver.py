"""Frames received straight into their buffers (`FrameReceiver`): the payloads are those
the stream holds however the socket cuts it, a large frame is received into one buffer of
its own size (no join, no copy), and a frame over the bound is refused before any buffer
for it is made."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorumlog.codec.frame import (
    COLLECT_BYTES_MIN,
    FRAME_HEADER,
    RECEIVE_BUFFER_BYTES,
    FrameError,
    FrameReceiver,
    encode_frame,
)


def receive_all(receiver: FrameReceiver, stream: bytes, reads: list[int]) -> list[bytes]:
    """Feed `stream` as a socket would: each read writes at most the next size in `reads`
    (cycled) into the buffer the receiver offers."""
    payloads: list[bytes] = []
    position = 0
    turn = 0
    while position < len(stream):
        buffer = receiver.receive_buffer()
        assert len(buffer) > 0, "the receiver offered no room"
        size = min(len(buffer), reads[turn % len(reads)], len(stream) - position)
        buffer[:size] = stream[position : position + size]
        position += size
        turn += 1
        payloads.extend(bytes(payload) for payload in receiver.received(size))
    return payloads


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(
        st.one_of(
            st.integers(min_value=0, max_value=300),
            st.integers(min_value=COLLECT_BYTES_MIN - 8, max_value=COLLECT_BYTES_MIN + 5000),
        ),
        max_size=8,
    ),
    reads=st.lists(st.integers(min_value=1, max_value=RECEIVE_BUFFER_BYTES), min_size=1).map(
        lambda sizes: [size if size > 64 else size * 997 for size in sizes]
    ),
)
def test_payloads_come_out_whole_and_in_order_however_the_socket_cuts_them(
    sizes: list[int], reads: list[int]
) -> None:
    payloads = [bytes([index % 251]) * size for index, size in enumerate(sizes)]
    stream = b"".join(encode_frame(payload) for payload in payloads)
    receiver = FrameReceiver()
    assert receive_all(receiver, stream, reads) == payloads
    assert receiver.staged_bytes == 0
    assert receiver.large is None


def test_a_stream_of_small_frames_read_a_byte_at_a_time() -> None:
    payloads = [b"a" * size for size in (0, 1, 5, 70, 3)]
    stream = b"".join(encode_frame(payload) for payload in payloads)
    assert receive_all(FrameReceiver(), stream, [1]) == payloads


def test_a_large_frame_is_received_into_one_buffer_of_its_size() -> None:
    payload = bytes(range(256)) * (4 * COLLECT_BYTES_MIN // 256)
    after = encode_frame(b"next")
    stream = encode_frame(payload) + after
    receiver = FrameReceiver()
    # The first read brings the header and a little of the payload.
    first = receiver.receive_buffer()
    first[:100] = stream[:100]
    assert receiver.received(100) == []
    large = receiver.large
    assert large is not None and len(large) == len(payload)
    # From now on the socket writes into that buffer, and never past the frame's end.
    buffer = receiver.receive_buffer()
    assert buffer.obj is large
    assert len(buffer) == len(payload) - (100 - FRAME_HEADER.size)
    rest = len(payload) + FRAME_HEADER.size - 100
    buffer[:rest] = stream[100 : 100 + rest]
    (received,) = receiver.received(rest)
    assert received is large  # handed on as it is: not joined, not copied
    assert received == payload
    assert receive_all(receiver, after, [1000]) == [b"next"]


def test_a_frame_over_the_bound_is_refused_before_a_buffer_is_made_for_it() -> None:
    receiver = FrameReceiver(frame_bytes_max=COLLECT_BYTES_MIN)
    buffer = receiver.receive_buffer()
    header = FRAME_HEADER.pack(COLLECT_BYTES_MIN + 1)
    buffer[: len(header)] = header
    with pytest.raises(FrameError, match="frame_bytes_max"):
        receiver.received(len(header))
    assert receiver.large is None
