"""What a KV log entry holds: the client batches the leader gathered into it.

One entry carries many clients' batches (group commit at the Raft level), stamped once
with the leader's clock. Every replica reads that stamp from the log, so rules that depend
on time (session expiry) decide the same way everywhere.
"""

from __future__ import annotations

import msgspec

from quorumlog.codec.wire import KVCommand, KVCommandResult


class ClientBatch(msgspec.Struct, frozen=True, array_like=True):
    client_id: str
    first_unacknowledged: int
    commands: list[KVCommand]


class KVEntry(msgspec.Struct, frozen=True, array_like=True):
    timestamp_ms: int
    batches: list[ClientBatch]
    expired_leases: list[int] = []
    """Leases the leader found expired by its clock: each replica revokes those that are
    still expired by the entry's stamp (a trailing field: older entries decode)."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEntry)


def encode_entry(entry: KVEntry) -> bytes:
    return _encoder.encode(entry)


def decode_entry(data: bytes) -> KVEntry:
    return _decoder.decode(data)


__all__ = ["ClientBatch", "KVCommand", "KVCommandResult", "KVEntry", "decode_entry", "encode_entry"]
