"""What a shard controller log entry holds: client batches of join, leave, move and query.

Like a KV entry, one controller entry carries many clients' batches and one leader stamp
(`timestamp_ms`), the only time the replicas see; sessions expire by it. Each command
carries the client's sequence, so (client id, sequence) names it for deduplication.
"""

from __future__ import annotations

import msgspec

from quorumlog.shard.config import ShardConfiguration


class Join(msgspec.Struct, frozen=True, array_like=True, tag="join"):
    """Add replica groups (gid → servers) and rebalance shards onto them."""

    sequence: int
    groups: dict[int, list[str]]


class Leave(msgspec.Struct, frozen=True, array_like=True, tag="leave"):
    """Remove replica groups; their shards go to the groups that stay."""

    sequence: int
    gids: list[int]


class Move(msgspec.Struct, frozen=True, array_like=True, tag="move"):
    """Give one shard to one group, without rebalancing (until the next join or leave)."""

    sequence: int
    shard: int
    gid: int


class Query(msgspec.Struct, frozen=True, array_like=True, tag="query"):
    """Read configuration `number`; -1, or a number past the latest, reads the latest."""

    sequence: int
    number: int = -1


ControllerCommand = Join | Leave | Move | Query


class ControllerResult(msgspec.Struct, frozen=True):
    ok: bool
    error: str | None = None
    """Why the command was rejected (nothing changed), when `ok` is False."""
    configuration_number: int | None = None
    """Join, leave, move: the configuration the command created. None for a query, and
    for a duplicate whose result the client had already acknowledged (then forgotten)."""
    configuration: ShardConfiguration | None = None
    """Query: the configuration read."""


class ControllerBatch(msgspec.Struct, frozen=True, array_like=True):
    client_id: str
    first_unacknowledged: int
    """Every sequence below this one has its answer at the client (results may go)."""
    commands: list[ControllerCommand]


class ControllerEntry(msgspec.Struct, frozen=True, array_like=True):
    timestamp_ms: int
    batches: list[ControllerBatch]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ControllerEntry)
_commands_decoder = msgspec.msgpack.Decoder(list[ControllerCommand])
_results_decoder = msgspec.msgpack.Decoder(list[ControllerResult])


def encode_entry(entry: ControllerEntry) -> bytes:
    return _encoder.encode(entry)


def decode_entry(data: bytes) -> ControllerEntry:
    """Decode an entry; raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _decoder.decode(data)


def encode_commands(commands: list[ControllerCommand]) -> bytes:
    """The `commands` of a wire.ControllerRequest."""
    return _encoder.encode(commands)


def decode_commands(data: bytes) -> list[ControllerCommand]:
    """Raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _commands_decoder.decode(data)


def encode_results(results: list[ControllerResult]) -> bytes:
    """The `results` of a wire.ControllerResponse."""
    return _encoder.encode(results)


def decode_results(data: bytes) -> list[ControllerResult]:
    """Raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _results_decoder.decode(data)


__all__ = [
    "ControllerBatch",
    "ControllerCommand",
    "ControllerEntry",
    "ControllerResult",
    "Join",
    "Leave",
    "Move",
    "Query",
    "decode_commands",
    "decode_entry",
    "decode_results",
    "encode_commands",
    "encode_entry",
    "encode_results",
]
