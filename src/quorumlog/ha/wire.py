"""The broker-to-broker HA channel (reference 003's AutoSwitchHAService protocol).

One connection per slave, opened by the slave to its master. Frames are msgpack-encoded
tagged msgspec structs (never pickle) with their own decoder here, apart from the client
wire (`codec/wire.py`). The transport frames them (length prefix) as every channel does.

The conversation, as 003 describes it:

1. slave -> master `HandshakeRequest`: who the slave is, whether it is an async learner,
   the MasterEpoch it expects (a master older than that is stale), its log layout.
2. master -> slave `HandshakeResponse`: the master's epoch list and max offset (or a
   refusal). The slave truncates at the consistent point of the two epoch lists.
3. slave -> master `Ack(max_offset)`: where transfer starts, after the truncation.
4. master -> slave `TransferBatch`es: messages of ONE epoch from `start_offset` to
   `end_offset`, with the epoch's start offset and the master's confirmOffset. A batch
   with no messages is a heartbeat (it still carries confirmOffset).
5. slave -> master `Ack(max_offset)` after each batch, once the messages are durable.
"""

from __future__ import annotations

import msgspec

from quorumlog.ha.epoch_file import EpochEntry


class HandshakeRequest(msgspec.Struct, frozen=True, array_like=True, tag="ha_handshake"):
    slave_id: str
    address: str
    async_learner: bool
    """A learner replicates but never joins the SyncStateSet (003's isAsyncLearner)."""
    master_epoch: int
    """The MasterEpoch under which the slave was told to follow this master."""
    data_file_bytes: int
    """The slave's commit log layout: offsets agree only if both sides share it."""


class HandshakeResponse(msgspec.Struct, frozen=True, array_like=True, tag="ha_handshake_ok"):
    master_id: str
    master_epoch: int
    max_offset: int
    min_offset: int
    epochs: list[EpochEntry]
    refused: str | None = None
    """Why the master will not replicate to this slave (then the rest is empty)."""


class TransferBatch(msgspec.Struct, frozen=True, array_like=True, tag="ha_transfer"):
    epoch: int
    epoch_start_offset: int
    start_offset: int
    end_offset: int
    confirm_offset: int
    messages: list[bytes]


class Ack(msgspec.Struct, frozen=True, array_like=True, tag="ha_ack"):
    max_offset: int
    """The slave's max offset, durable on the slave."""


HAFrame = HandshakeRequest | HandshakeResponse | TransferBatch | Ack

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[HAFrame] = msgspec.msgpack.Decoder(HAFrame)


def encode_frame(frame: HAFrame) -> bytes:
    return _encoder.encode(frame)


def decode_frame(data: bytes | memoryview) -> HAFrame:
    """Decode one frame; msgspec.DecodeError (a ValueError) if it is malformed."""
    return _decoder.decode(data)


__all__ = [
    "Ack",
    "HAFrame",
    "HandshakeRequest",
    "HandshakeResponse",
    "TransferBatch",
    "decode_frame",
    "encode_frame",
]
