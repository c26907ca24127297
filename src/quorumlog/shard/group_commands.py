"""What a shard group's log entries hold, what applying them returns, and the messages two
groups exchange to move a shard.

Every change to a shard group's state goes through its Raft log as one of five entries:

* `ClientWrites` — client batches (as in a KV entry), stamped once with the leader's clock;
* `NewConfiguration` — the next configuration from the controller (one number at a time);
* `InsertShards` — shard data and dedup sessions pulled from their previous owner;
* `DeleteShards` — on the previous owner: drop the copy the new owner now holds; on the new
  owner: the previous owner confirmed that drop (garbage collection is finished);
* `EmptyEntry` — a new leader's entry of its own term, so its commit index can move even
  when no client writes (the reference's live lock when a group waits on another).

Between groups (any transport): the new owner sends `PullRequest` to the previous owner and
gets `PullResponse`, which carries an `InsertShards` ready to propose; once that is applied it
sends `DeleteRequest` and gets `DeleteResponse`. Every message names the configuration number
it is about, which is what makes a late or repeated message harmless.
"""

from __future__ import annotations

import enum

import msgspec

from quorumlog.codec.kv_v3 import WatchEvent
from quorumlog.codec.wire import KVCommandResult
from quorumlog.kv.commands import ClientBatch
from quorumlog.kv.sessions import SessionRecord
from quorumlog.shard.config import ShardConfiguration

# --- log entries ----------------------------------------------------------------------------


class ClientWrites(msgspec.Struct, frozen=True, array_like=True, tag="client_writes"):
    """Client write batches. Each command goes to the shard of its key."""

    timestamp_ms: int
    """The leader's clock when it built the entry: the only time replicas see."""
    batches: list[ClientBatch]


class NewConfiguration(msgspec.Struct, frozen=True, array_like=True, tag="new_configuration"):
    """Move to `configuration` (applied only if it is number current + 1, all shards Serving)."""

    configuration: ShardConfiguration


class InsertShards(msgspec.Struct, frozen=True, array_like=True, tag="insert_shards"):
    """Shards pulled from their previous owner for configuration `configuration_number`."""

    configuration_number: int
    shards: dict[int, dict[str, str]]
    """shard → its keys and values, as the previous owner froze them."""
    sessions: dict[int, list[SessionRecord]]
    """shard → its dedup sessions, so a retry of a write applied there is not applied here."""
    finished: list[int] | None = None
    """The shards this entry completes (they start serving); the others only add data and
    sessions and stay PULLING, waiting for their next chunk. None: every shard in `shards`
    is complete. A large shard moves in chunks so no log entry or frame has to hold all
    of it."""

    clock_ms: int = 0
    """The previous owner's entry time when it answered. The new owner moves its own clock
    up to it before merging the sessions: sessions are stamped with the new owner's clock,
    and a clock that is stale (an idle group, or one that never saw a client write) would
    let its next write expire them at once, and a retry would then be applied twice."""

    key_revisions: dict[int, list[tuple[int, int, int]]] | None = None
    """shard → (create revision, mod revision, version) of each key in `shards[shard]`, in
    the same order. None: from a build before revisions (the new owner makes them up)."""
    store_revisions: dict[int, int] | None = None
    """shard → its revision, frozen since it became BE_PULLING (`shard.shard_store`)."""
    history: dict[int, list[WatchEvent]] | None = None
    """shard → events of its history (each with its key-before), oldest first: what
    watches and reads at past revisions need. None: from a build that left it behind."""
    compacted_revisions: dict[int, int] | None = None
    """shard → the revision its history was compacted to (it starts after it)."""

    def is_finished(self, shard: int) -> bool:
        return self.finished is None or shard in self.finished


class DeleteShards(msgspec.Struct, frozen=True, array_like=True, tag="delete_shards"):
    """Garbage collection of `shards` for configuration `configuration_number`."""

    configuration_number: int
    shards: list[int]


class EmptyEntry(msgspec.Struct, frozen=True, array_like=True, tag="empty"):
    """Changes nothing; lets a new leader commit an entry of its own term."""


GroupEntry = ClientWrites | NewConfiguration | InsertShards | DeleteShards | EmptyEntry

# --- apply results --------------------------------------------------------------------------


class WrongGroup(msgspec.Struct, frozen=True, array_like=True, tag="wrong_group"):
    """This group does not serve `shard` now: the client should fetch a newer configuration.

    Nothing was applied, so a retry elsewhere is safe (and is deduplicated there if the
    command had been applied before the shard moved).
    """

    shard: int
    configuration_number: int
    """The configuration this group is in: the client needs at least this one."""


WriteResult = KVCommandResult | WrongGroup


class WritesApplied(msgspec.Struct, frozen=True):
    """The result of a `ClientWrites` entry: one list per client batch, one result per command."""

    results: list[list[WriteResult]]


class ControlApplied(msgspec.Struct, frozen=True):
    """The result of a configuration, insert, delete or empty entry."""

    accepted: bool
    """False: the entry was for another configuration number or came too early; nothing
    changed. An entry whose work was already done (a replay) is accepted with no shards."""
    configuration_number: int
    """The group's configuration number after the entry."""
    shards: list[int] = msgspec.field(default_factory=list)
    """The shards whose state this entry changed, ascending."""
    reason: str | None = None
    """Why the entry was not accepted."""


GroupApplyResult = WritesApplied | ControlApplied

# --- messages between groups -----------------------------------------------------------------


class PullStatus(enum.Enum):
    OK = "ok"
    NOT_READY = "not_ready"
    """The previous owner has not applied the requested configuration yet: ask again later."""
    GONE = "gone"
    """The previous owner is past that configuration or already dropped the shards, which it
    does only after the new owner inserted them: the requester's state is about to show it."""


class PullRequest(msgspec.Struct, frozen=True, tag="pull_request"):
    requester_gid: int
    configuration_number: int
    """The requester's current configuration: the one in which it owns `shards`."""
    shards: list[int]
    resume_at: tuple[int, int] | None = None
    """Resume a chunked pull at (shard, position in its sorted keys): the `resume_at` of
    the last answer. Positions agree on every replica because the data is frozen."""
    bytes_max: int = 0
    """Stop the answer once it holds about this many bytes of keys and values (0: no bound).
    At least one key is always sent, so every chunk makes progress."""
    resume_last_key: str | None = None
    """Set when `resume_at` was worked out from the requester's own state (a new leader
    going on with a pull its predecessor began) rather than taken from the last answer:
    the last key the requester holds of that shard. The previous owner resumes only if
    its key just before `resume_at` is this one, and otherwise starts the pull over, so a
    wrong resume point can cost time but never skip data."""


class PullResponse(msgspec.Struct, frozen=True, tag="pull_response"):
    source_gid: int
    configuration_number: int
    status: PullStatus
    insert: InsertShards | None = None
    """With `OK`: the entry the requester proposes as is."""
    resume_at: tuple[int, int] | None = None
    """With `OK`, when the answer stopped at `bytes_max`: ask again with this `resume_at`."""


class DeleteRequest(msgspec.Struct, frozen=True, tag="delete_request"):
    requester_gid: int
    configuration_number: int
    shards: list[int]


class DeleteResponse(msgspec.Struct, frozen=True, tag="delete_response"):
    source_gid: int
    configuration_number: int
    shards: list[int]
    ok: bool
    """True once the previous owner no longer holds the shards for that configuration."""


GroupMessage = PullRequest | PullResponse | DeleteRequest | DeleteResponse

# --- encoding -------------------------------------------------------------------------------

_encoder = msgspec.msgpack.Encoder()
_entry_decoder: msgspec.msgpack.Decoder[GroupEntry] = msgspec.msgpack.Decoder(GroupEntry)
_message_decoder: msgspec.msgpack.Decoder[GroupMessage] = msgspec.msgpack.Decoder(GroupMessage)


def encode_entry(entry: GroupEntry) -> bytes:
    return _encoder.encode(entry)


def decode_entry(data: bytes) -> GroupEntry:
    """Decode an entry; raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _entry_decoder.decode(data)


def encode_message(message: GroupMessage) -> bytes:
    return _encoder.encode(message)


def decode_message(data: bytes) -> GroupMessage:
    """Decode a message; raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _message_decoder.decode(data)


__all__ = [
    "ClientWrites",
    "ControlApplied",
    "DeleteRequest",
    "DeleteResponse",
    "DeleteShards",
    "EmptyEntry",
    "GroupApplyResult",
    "GroupEntry",
    "GroupMessage",
    "InsertShards",
    "NewConfiguration",
    "PullRequest",
    "PullResponse",
    "PullStatus",
    "WriteResult",
    "WritesApplied",
    "WrongGroup",
    "decode_entry",
    "decode_message",
    "encode_entry",
    "encode_message",
]
