"""The etcd v3-style KV's messages: what a multi-version write carries and answers.

A v3 write travels as a `KVCommand` with op `V3_OP` whose `payload` is one `V3Command`
(a txn, which also carries plain puts and range deletes, or a lease or compaction
command) encoded here; its `KVCommandResult.payload` is one `V3Response`. Riding on
`KVCommand` keeps one write path: the same sessions deduplicate a retried txn, the same
group commit batches it with plain writes. Reads (range, watch, lease time-to-live) are
their own frames in `codec.wire`, answered behind the same read barrier as `KVRead`.

Keys are text (as everywhere in the KV); values are bytes. A range's `end` follows etcd:
None is the one key, `RANGE_END_ALL` ("\\0") is every key from `key` on, any other string
is the first key after the range.
"""

from __future__ import annotations

import msgspec

V3_OP = "v3"
"""`KVCommand.op` of a v3 write."""
RANGE_END_ALL = "\x00"
"""A range end meaning "to the last key" (etcd's "\\0")."""


class KeyValue(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One key as the store holds it at some revision (etcd's mvccpb.KeyValue)."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    """Writes since the key was created (1 after its creation); 0 for a deleted key."""
    lease: int = 0


class WatchEvent(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One change: `kv` is the key after a PUT; after a DELETE it carries the key, the
    deletion's revision as `mod_revision`, an empty value and version 0 (as etcd)."""

    type: str
    """"PUT" or "DELETE"."""
    kv: KeyValue
    prev_kv: KeyValue | None = None


class Compare(msgspec.Struct, frozen=True, array_like=True):
    target: str
    """"value", "version", "create" or "mod"."""
    key: str
    operator: str
    """"==", "!=", "<" or ">"."""
    operand: bytes | int


class RequestOp(msgspec.Struct, frozen=True, array_like=True):
    """One operation of a txn branch."""

    kind: str
    """"put", "delete" (a range: `end` as in a range read) or "get" (a range read)."""
    key: str
    end: str | None = None
    value: bytes = b""
    lease: int = 0
    prev_kv: bool = False
    limit: int = 0
    keys_only: bool = False


class Txn(msgspec.Struct, frozen=True, tag=True, array_like=True):
    compares: list[Compare]
    success: list[RequestOp]
    failure: list[RequestOp]


class LeaseGrant(msgspec.Struct, frozen=True, tag=True, array_like=True):
    ttl_seconds: int


class LeaseRevoke(msgspec.Struct, frozen=True, tag=True, array_like=True):
    lease_id: int


class LeaseKeepAlive(msgspec.Struct, frozen=True, tag=True, array_like=True):
    lease_id: int


class Compact(msgspec.Struct, frozen=True, tag=True, array_like=True):
    revision: int


V3Command = Txn | LeaseGrant | LeaseRevoke | LeaseKeepAlive | Compact


class ResponseOp(msgspec.Struct, frozen=True, array_like=True):
    """The answer of one RequestOp: a get's `kvs`/`count`/`more`, a delete's `deleted`,
    and the keys before a put or delete in `prev_kvs` when asked."""

    kind: str
    kvs: list[KeyValue] = []
    count: int = 0
    more: bool = False
    deleted: int = 0
    prev_kvs: list[KeyValue] = []


class TxnResponse(msgspec.Struct, frozen=True, tag=True, array_like=True):
    succeeded: bool
    responses: list[ResponseOp]
    revision: int
    """The store's revision after the txn."""


class LeaseResponse(msgspec.Struct, frozen=True, tag=True, array_like=True):
    lease_id: int
    ttl_seconds: int
    revision: int


class CompactResponse(msgspec.Struct, frozen=True, tag=True, array_like=True):
    revision: int


class V3Failure(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """A v3 command the store refused; nothing changed."""

    code: str
    """"lease_not_found", "lease_exists", "compacted", "future_revision", "bad_request"."""
    message: str


V3Response = TxnResponse | LeaseResponse | CompactResponse | V3Failure

_encoder = msgspec.msgpack.Encoder()
_command_decoder = msgspec.msgpack.Decoder(V3Command)
_response_decoder = msgspec.msgpack.Decoder(V3Response)


def encode_command(command: V3Command) -> bytes:
    return _encoder.encode(command)


def decode_command(data: bytes) -> V3Command:
    command: V3Command = _command_decoder.decode(data)
    return command


def encode_response(response: V3Response) -> bytes:
    return _encoder.encode(response)


def decode_response(data: bytes) -> V3Response:
    response: V3Response = _response_decoder.decode(data)
    return response


def in_range(key: str, start: str, end: str | None) -> bool:
    """Whether `key` falls in the range [start, end) as etcd reads `end`."""
    if end is None:
        return key == start
    if end == RANGE_END_ALL:
        return key >= start
    return start <= key < end


__all__ = [
    "RANGE_END_ALL",
    "V3_OP",
    "Compact",
    "CompactResponse",
    "Compare",
    "KeyValue",
    "LeaseGrant",
    "LeaseKeepAlive",
    "LeaseResponse",
    "LeaseRevoke",
    "RequestOp",
    "ResponseOp",
    "Txn",
    "TxnResponse",
    "V3Command",
    "V3Failure",
    "V3Response",
    "WatchEvent",
    "decode_command",
    "decode_response",
    "encode_command",
    "encode_response",
    "in_range",
]
