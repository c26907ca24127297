"""The producer's records and metadata encode to the same bytes whatever their struct options
(`gc=False` changes how Python tracks them, never the wire): fixed encodings of known records,
taken before the options changed."""

from __future__ import annotations

import gc

import msgspec

from quorumlog.codec import wire
from quorumlog.stream.producer import NO_HEADERS
from quorumlog.stream.records import RecordMetadata

PRODUCE_HEX = (
    "8aa474797065a750726f64756365aa726571756573745f696407a5746f706963a66576656e7473a9706172"
    "746974696f6e02ab70726f64756365725f6964a27031ad626173655f73657175656e636528a77265636f72"
    "64739394c40576616c7565c4036b6579cd04d29192a168c4017694c40178c0009094c0c4016b0090ab636f"
    "6d7072657373696f6ea46e6f6e65aa636f6d70726573736564c400ac7265636f72645f636f756e7400"
)
METADATA_MSGPACK_HEX = (
    "84a5746f706963a66576656e7473a9706172746974696f6e02a66f666673657429a974696d657374616d70cd06a4"
)


def known_records() -> list[wire.Record]:
    return [
        wire.Record(b"value", b"key", 1234, [("h", b"v")]),
        wire.Record(b"x", None, 0, NO_HEADERS),  # what send builds for a record without headers
        wire.Record(None, b"k"),  # a tombstone
    ]


def test_a_produce_frame_encodes_as_before() -> None:
    frame = wire.Produce(
        request_id=7,
        topic="events",
        partition=2,
        producer_id="p1",
        base_sequence=40,
        records=known_records(),
    )
    assert wire.encode(frame).hex() == PRODUCE_HEX
    assert wire.encode(wire.decoder.decode(bytes.fromhex(PRODUCE_HEX))).hex() == PRODUCE_HEX


def test_record_metadata_encodes_as_before() -> None:
    metadata = RecordMetadata("events", 2, 41, 1700)
    assert msgspec.msgpack.encode(metadata).hex() == METADATA_MSGPACK_HEX
    assert msgspec.json.encode(metadata) == (
        b'{"topic":"events","partition":2,"offset":41,"timestamp":1700}'
    )


def test_records_and_metadata_are_not_tracked_by_the_garbage_collector() -> None:
    assert not any(gc.is_tracked(record) for record in known_records())
    assert not gc.is_tracked(RecordMetadata("events", 2, 41, 1700))
    assert RecordMetadata.__struct_config__.gc is False
    assert wire.Record.__struct_config__.gc is False
