"""A produce batch is refused above PRODUCE_BYTES_MAX, counting keys as well as values."""

from __future__ import annotations

from quorumlog.codec import wire
from quorumlog.node import stream_service
from quorumlog.node.stream_service import batch_bytes, refuse_batch


def produce(records: list[wire.Record]) -> wire.Produce:
    return wire.Produce(
        request_id=7, topic="t", partition=0, producer_id="p", base_sequence=0, records=records
    )


def test_batch_bytes_counts_values_and_keys_that_are_there() -> None:
    records = [wire.Record(b"abc"), wire.Record(b"de", b"kk"), wire.Record(b"", b"")]
    assert batch_bytes(records) == 7


def test_a_batch_over_the_bytes_bound_by_its_keys_is_refused_too_large() -> None:
    half = stream_service.PRODUCE_BYTES_MAX // 2
    answers: list[wire.Frame] = []
    assert not refuse_batch(produce([wire.Record(b"v" * half, b"k" * half)]), answers.append)
    assert refuse_batch(produce([wire.Record(b"v" * half, b"k" * (half + 1))]), answers.append)
    assert refuse_batch(produce([]), answers.append)
    assert [answer.code for answer in answers if isinstance(answer, wire.ErrorResponse)] == [
        wire.ErrorCode.TOO_LARGE,
        wire.ErrorCode.BAD_REQUEST,
    ]
