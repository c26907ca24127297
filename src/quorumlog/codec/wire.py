"""Everything that crosses a socket: msgspec structs, tagged, encoded as MessagePack frames.

A connection starts with `Hello` from the side that dialled; the other side answers with
`Welcome` or closes it with a `Refused` naming the reason (wrong cluster id, bad protocol
version). Peers then exchange `PeerBatch`es of Raft messages; clients send requests, each
with a `request_id` its response echoes, so a client may pipeline many on one connection.
"""

from __future__ import annotations

import enum

import msgspec

from quorumlog.codec.feature_levels import BASELINE_FEATURE_LEVEL
from quorumlog.codec.heartbeat_rows import HeartbeatAnswerRow, HeartbeatRow
from quorumlog.codec.kv_v3 import KeyValue, V3Failure, WatchEvent
from quorumlog.raft.messages import Message

PROTOCOL_VERSION = 1


class Hello(msgspec.Struct, frozen=True, tag=True):
    cluster_id: str
    sender: str
    """The dialling node's id, or a client's name."""
    is_peer: bool
    protocol_version: int = PROTOCOL_VERSION
    listen: str = ""
    """A peer's own "host:port", where the others should reach it now (it may have
    restarted on a new one); empty from a client. A wildcard host ("0.0.0.0") stands for
    the address the connection came from."""
    feature_level: int = BASELINE_FEATURE_LEVEL
    """A peer's release's feature level (codec/feature_levels.py). Trailing, with a
    default: a node from before the gate says nothing and runs the baseline."""
    heartbeat_rows: bool = False
    """The peer reads heartbeats as rows (`PeerBatch.heartbeats`, codec/heartbeat_rows.py).
    Trailing: a node from before them says nothing and gets envelopes."""


class Welcome(msgspec.Struct, frozen=True, tag=True):
    node_id: str
    produce_many: bool = False
    """The node serves ProduceMany frames. A trailing field with a default: a node from
    before them says nothing, and its clients send each Produce alone (an unknown frame
    type would close the connection)."""
    feature_level: int = BASELINE_FEATURE_LEVEL
    """The node's release's feature level, as `Hello.feature_level`, for the dialling
    peer. Trailing, with a default."""
    heartbeat_rows: bool = False
    """As `Hello.heartbeat_rows`, for the dialling peer. Trailing, with a default."""


class Refused(msgspec.Struct, frozen=True, tag=True):
    reason: str


class RaftEnvelope(msgspec.Struct, frozen=True, tag=True):
    group: str
    message: Message


class PeerBatch(msgspec.Struct, frozen=True, tag=True, omit_defaults=True):
    """Raft messages coalesced into one frame per flush."""

    envelopes: list[RaftEnvelope]
    down_node: str = ""
    """With `down_groups`: the sending node, on which those groups stopped."""
    down_groups: list[str] = msgspec.field(default_factory=list)
    """Groups that stopped on the sending node (a storage failure) while the node goes on
    serving: its liveness pings still say "alive", so a quiet group whose leader it was
    would wait forever; the receiver treats the sender as unreachable for these groups."""
    source: str = ""
    """The sending node, the source of every row below (set whenever there are rows)."""
    heartbeats: list[HeartbeatRow] = msgspec.field(default_factory=list)
    """Plain heartbeats as rows (codec/heartbeat_rows.py), only to a peer that said it reads
    them (`Hello.heartbeat_rows`); a node from before them would skip the field."""
    heartbeat_answers: list[HeartbeatAnswerRow] = msgspec.field(default_factory=list)
    """Plain heartbeats' answers as rows, as `heartbeats`."""


# --- client requests ----------------------------------------------------------------------


class ErrorCode(enum.Enum):
    NOT_LEADER = "not_leader"
    PENDING_FULL = "pending_full"
    TRANSFERRING = "transferring"
    TIMEOUT = "timeout"
    BAD_REQUEST = "bad_request"
    UNKNOWN_GROUP = "unknown_group"
    TOO_LARGE = "too_large"
    CONFIGURATION_IN_PROGRESS = "configuration_in_progress"
    INVALID_CONFIGURATION_CHANGE = "invalid_configuration_change"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    OUT_OF_RANGE = "out_of_range"
    WRONG_GROUP = "wrong_group"
    SESSION_EXPIRED = "session_expired"
    """The cluster no longer has the client's session: the write was not carried out."""
    NOT_ENOUGH_REPLICAS = "not_enough_replicas"
    """An HA topic's master has fewer SyncStateSet members than `min_in_sync`: the produce
    was refused, nothing written; retry after a back-off. A client older than this member
    cannot decode the answer and treats the connection as broken (its request's outcome
    unknown, retried elsewhere)."""
    PERMISSION_DENIED = "permission_denied"
    """Auth: the caller's roles do not grant the request. Never retried."""
    AUTHENTICATION_REQUIRED = "authentication_required"
    """Auth is enabled and the request carried no token. Never retried."""
    AUTHENTICATION_FAILED = "authentication_failed"
    """Authenticate: unknown user or wrong password. Never retried."""
    AUTH_TOKEN_INVALID = "auth_token_invalid"
    """The token is unknown here (another node issued it, or this one restarted), expired,
    or its user changed: the client authenticates again on this connection and retries."""
    RESERVED_KEY = "reserved_key"
    """A user request wrote, deleted or scanned a key starting with "__", which only
    quorumlog's own services may (they mark their requests `internal`): nothing done."""


class KVCommand(msgspec.Struct, frozen=True, array_like=True):
    """One write; (client id, sequence) makes a retry of it idempotent."""

    sequence: int
    op: str
    """"put", "append", "delete" or "cas"."""
    key: str
    value: str | None = None
    expected: str | None = None
    """For "cas": the value the key must hold now (None: it must be missing)."""
    payload: bytes | None = None
    """For op "v3": one `codec.kv_v3.V3Command`, encoded. A trailing field with a default,
    so commands from an older client decode here."""


class KVCommandResult(msgspec.Struct, frozen=True, array_like=True):
    ok: bool = True
    value: str | None = None
    """"put"/"append"/"delete": the value before; "cas": the value found."""
    error: ErrorCode | None = None
    """Set when the command was not carried out for a reason the caller must see as an
    error, not as an answer: SESSION_EXPIRED. `ok` is then False. A trailing field with a
    default, so results from an older node decode here, and an older client (which ignores
    the field) sees a refusal, which is true: nothing was done."""
    payload: bytes | None = None
    """For op "v3": one `codec.kv_v3.V3Response`, encoded."""


FIRST_SEQUENCE = 1
"""Clients number their commands from here (`KVCommand.sequence`)."""


class KVWrite(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    client_id: str
    commands: list[KVCommand]
    first_unacknowledged: int = 0
    """Every sequence below this one has its answer at the client: the cluster may forget
    those results (Raft dissertation §6.3). A client sends at most FIRST_SEQUENCE until
    one of its writes has been answered: the cluster takes a client it has no session for
    as new only then (`kv.sessions`)."""
    group: str = "kv"
    internal: bool = False
    """Sent by quorumlog's own services (kv/internal_keys.py): may write keys starting with
    "__" (topics, offsets, ledgers, bookies, ...), which the "kv" group refuses otherwise."""


class KVRead(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    keys: list[str]
    stale: bool = False
    """Serve from this node's applied state without confirming leadership (may be old)."""
    group: str = "kv"


class KVScan(msgspec.Struct, frozen=True, tag=True):
    """Keys in [start, end) in key order (end None: to the last key), at most `limit`."""

    request_id: int
    start: str = ""
    end: str | None = None
    limit: int = 1000
    stale: bool = False
    group: str = "kv"
    shards: list[int] | None = None
    """Sharded KV: the shards the client expects this group to serve. The group answers
    WRONG_GROUP unless it serves every one, and returns keys of those shards only."""
    internal: bool = False
    """As `KVWrite.internal`: only then does a scan of the "kv" group return "__" keys."""


class KVScanResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    items: list[tuple[str, str]]
    next_start: str | None
    """Where the next page starts, or None when the range is done."""


class KVWriteResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    results: list[KVCommandResult]


class KVReadResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    values: list[str | None]


class ErrorResponse(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    code: ErrorCode
    message: str
    leader_hint: str | None = None
    """Where the leader listens ("host:port"), for NOT_LEADER."""


class StatusRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    group: str = "kv"


class StatusResponse(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    node_id: str
    group: str
    role: str
    is_leader: bool
    leader: str | None
    term: int
    commit_index: int
    applied_index: int
    first_index: int
    last_index: int
    voters: list[str]
    learners: list[str]
    addresses: dict[str, str]
    errors: list[str] = []
    cluster_level: int = 0
    """The highest feature level this node knows its cluster committed
    (codec/feature_levels.py); 0: a node from before the gate."""


class MemberChangeRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    kind: str
    """"add_voter", "add_learner", "promote_learner" or "remove"."""
    node_id: str
    address: str | None = None
    group: str = "kv"


class TransferLeaderRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    target: str
    group: str = "kv"


class Done(msgspec.Struct, frozen=True, tag=True):
    """A request that returns nothing succeeded."""

    request_id: int
    detail: str = ""


# --- sharded KV ---------------------------------------------------------------------------
#
# Shard groups take KVWrite / KVRead / KVScan with group "shard-<gid>" and answer
# WRONG_GROUP for a key whose shard they do not serve now. The controller and the messages
# between groups carry their payloads as bytes encoded by `quorumlog.shard` (controller
# commands and results, pull and delete messages): the shard package builds on this
# module's KV types, so this module cannot import it.

CONTROLLER_GROUP = "controller"


def shard_group_name(gid: int) -> str:
    """The Raft group id of shard group `gid` on the nodes hosting it."""
    return f"shard-{gid}"


class ControllerRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    client_id: str
    commands: bytes
    """`shard.controller_commands.encode_commands` of join / leave / move / query."""
    first_unacknowledged: int = 0


class ControllerResponse(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    results: bytes
    """`shard.controller_commands.encode_results`: one result per command, in order."""


class ShardGroupRequest(msgspec.Struct, frozen=True, tag=True):
    """A message from one shard group's leader to another group: a pull or a delete."""

    request_id: int
    gid: int
    """The group that should answer."""
    message: bytes
    """`shard.group_commands.encode_message` of a PullRequest or DeleteRequest."""


class ShardGroupResponse(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    message: bytes
    """`shard.group_commands.encode_message` of a PullResponse or DeleteResponse."""


class ShardStatusRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    gid: int


class ShardStatusResponse(msgspec.Struct, frozen=True, tag=True):
    """One replica's view of its shard group."""

    request_id: int
    node_id: str
    gid: int
    is_leader: bool
    leader: str | None
    """The leader's address ("host:port"), if known."""
    configuration_number: int
    shard_states: dict[int, str]
    """shard → state ("serving", "pulling", "be_pulling", "garbage_collecting") for every
    shard this group owns now or still holds for another."""
    stored_keys: int
    applied_index: int


# --- streams ------------------------------------------------------------------------------


class Record(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One record as a producer sends it; the partition leader assigns its offset."""

    value: bytes | None
    """None: a tombstone (Kafka's null value). Readers before tombstones decoded bytes only."""
    key: bytes | None = None
    timestamp_ms: int = 0
    """0: the leader stamps its clock when it appends the batch."""
    headers: list[tuple[str, bytes]] = []


class RecordBatch(msgspec.Struct, frozen=True, array_like=True):
    """What one partition log entry holds: a producer's batch, with the leader's stamp.

    Records get offsets base_offset, base_offset + 1, ... in order; the base offset is
    assigned when the entry is applied (deduplicated batches get none).

    Format versions: 1 is the first four fields; 2 adds the codec (`codec.compression`).
    A compressed batch has no `records`; `compressed` holds the codec's bytes of the
    msgpack list of its records, and `record_count` how many. An uncompressed batch is
    encoded exactly as in version 1 (`encode_record_batch`), and version-1 batches decode
    as uncompressed."""

    producer_id: str
    base_sequence: int
    timestamp_ms: int
    records: list[Record]
    compression: str = "none"
    compressed: bytes = b""
    record_count: int = -1


class TopicSettings(msgspec.Struct, frozen=True, array_like=True):
    partitions: int
    replication: int
    retention_bytes: int = -1
    """Per partition; -1: unbounded."""
    retention_ms: int = -1
    """-1: unbounded."""
    storage: str = "raft"
    """"raft" (each partition a Raft group), "ledger" (each partition a list of ledgers
    on bookies, written by its owner) or "ha" (each partition a broker group's commit log,
    written by its master, reference 003). The fields from here on were added later, with
    defaults, so descriptors stored before them still decode."""
    ensemble: int = 3
    """Ledger storage: bookies per ledger (E)."""
    write_quorum: int = 2
    """Ledger storage: bookies each entry is written to (Qw)."""
    ack_quorum: int = 2
    """Ledger storage: acknowledgements an entry waits for (Qa)."""


class TopicDescriptor(msgspec.Struct, frozen=True, array_like=True):
    """Stored in the metadata group: which nodes replicate each partition, and where."""

    name: str
    settings: TopicSettings
    replicas: list[list[str]]
    """replicas[p]: the node ids hosting partition p."""
    addresses: dict[str, str]
    created_ms: int


class CreateTopic(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    name: str
    settings: TopicSettings


class DeleteTopic(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    name: str


class ListTopics(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    with_leaders: bool = False
    """Also say each partition's leader, as this node knows it (`TopicList.leaders`): a
    producer about to send to a thousand fresh partitions learns where to in one round
    trip, as Kafka's Metadata request. Trailing, with a default: a node from before it
    ignores it and answers without leaders."""


class TopicList(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    topics: list[TopicDescriptor]
    leaders: dict[str, list[str]] = {}
    """Asked for with `ListTopics.with_leaders`: topic → the node id leading each of its
    partitions, "" where this node does not know (it hosts no replica, no leader yet, or
    the partition is not a Raft group). Trailing, with a default."""


class Produce(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    topic: str
    partition: int
    producer_id: str
    base_sequence: int
    """The sequence of the first record; (producer id, sequence) dedups a retried batch."""
    records: list[Record]
    compression: str = "none"
    """Set (with `compressed` and `record_count`, and no `records`) for a compressed batch:
    the node stores the bytes as they came (see RecordBatch), on every storage mode."""
    compressed: bytes = b""
    record_count: int = 0


class ProduceResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    base_offset: int
    count: int
    duplicate: bool = False
    timestamp_ms: int = -1
    """The leader's stamp on the batch (its records' log-append time); -1 where the storage
    does not say. A trailing field with a default: older nodes' answers still decode."""


class Fetch(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    topic: str
    partition: int
    offset: int
    records_max: int = 10_000
    bytes_max: int = 4 * 1024 * 1024
    leader_only: bool = False
    """Only the partition's leader answers (others say NOT_LEADER with a hint): a reader
    then sees every record acknowledged to a producer. A follower serves what it has
    applied, which may trail the leader by a moment."""
    max_wait_ms: int = 0
    """Long polling: with nothing to return at `offset` (the end), the replica holds the
    fetch up to this long and answers as soon as records arrive. 0 answers at once. A
    trailing field with a default, so fetches from older clients decode as before."""


class FetchedBatch(msgspec.Struct, frozen=True, array_like=True):
    base_offset: int
    data: bytes
    """An encoded RecordBatch, exactly as it sits in the log (no re-encoding on the way)."""


class FetchResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    begin_offset: int
    end_offset: int
    """One past the last committed offset (the high watermark)."""
    batches: list[FetchedBatch]


class PartitionStatusRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    topic: str
    partition: int


class PartitionStatus(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    topic: str
    partition: int
    node_id: str
    leader: str | None
    replicas: list[str]
    in_sync: list[str]
    """Replicas whose log matches the leader's commit index (as the leader sees them)."""
    begin_offset: int
    end_offset: int
    term: int
    commit_index: int


# --- bookies (reference 001): the ledger client talks to each bookie directly ----------------


class BookieStatus(enum.Enum):
    OK = "ok"
    NO_SUCH_LEDGER = "no_such_ledger"
    NO_SUCH_ENTRY = "no_such_entry"
    """An explicit "I do not have it" (recovery counts these; an unknown is not one)."""
    FENCED = "fenced"
    """The ledger is fenced: a new writer recovers it; adds (but recovery adds) are refused."""
    UNAUTHORIZED = "unauthorized"
    """The master key does not match the one the ledger was created with."""
    BAD_REQUEST = "bad_request"
    TOO_LARGE = "too_large"
    READ_ONLY = "read_only"
    """The bookie cannot take writes now (its disk is full): write elsewhere."""


class LedgerEntryData(msgspec.Struct, frozen=True, array_like=True, gc=False):
    entry_id: int
    data: bytes


class AddEntries(msgspec.Struct, frozen=True, tag=True):
    """Store entries of one ledger on this bookie. Answered once they are durable (journal
    fsync). `last_add_confirmed` rides along and is stored with them (the LAC piggyback)."""

    request_id: int
    ledger_id: int
    master_key: bytes
    last_add_confirmed: int
    entries: list[LedgerEntryData]
    recovery: bool = False
    """A recovery re-write: accepted on a fenced ledger."""
    length: int = -1
    """The ledger's length in bytes through `last_add_confirmed`, stored with it (-1: not
    known). Recovery starts from a bookie's LAC only when it knows the length there."""


class AddEntriesResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    ledger_id: int
    status: BookieStatus
    entry_ids: list[int] = []
    """The entries now durable here (all of the request's when status is OK)."""


class ReadEntries(msgspec.Struct, frozen=True, tag=True):
    """Entries first..last (inclusive) of one ledger, as many as fit `bytes_max`."""

    request_id: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    bytes_max: int = 4 * 1024 * 1024


class ReadEntriesResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    ledger_id: int
    status: BookieStatus
    """NO_SUCH_ENTRY when the first entry asked for is not here."""
    entries: list[LedgerEntryData] = []
    last_add_confirmed: int = -1
    """The highest LAC this bookie has stored for the ledger."""


class ReadLastAddConfirmed(msgspec.Struct, frozen=True, tag=True):
    """The LAC this bookie holds; with `fence`, first fence the ledger (durably): no add
    but a recovery add is taken afterwards. Fencing needs the master key."""

    request_id: int
    ledger_id: int
    fence: bool = False
    master_key: bytes = b""


class LastAddConfirmedResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    ledger_id: int
    status: BookieStatus
    last_add_confirmed: int = -1
    last_entry_id: int = -1
    """The highest entry id stored here (-1: none)."""
    length: int = -1
    """The `length` stored with `last_add_confirmed` (-1: not known)."""


class DropLedger(msgspec.Struct, frozen=True, tag=True):
    """Forget a deleted ledger's entries on this bookie (answered with Done)."""

    request_id: int
    ledger_id: int


# --- HA controller (reference 003): broker groups, masters, SyncStateSets -------------------
#
# Like the shard controller's, the payloads are bytes encoded by `quorumlog.ha`
# (`ha.controller_model.encode_commands` / `encode_results`): that package builds on this
# module, so this module cannot import its types.

HA_CONTROLLER_GROUP = "ha-controller"


class HAControllerRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    client_id: str
    commands: bytes
    """`ha.controller_model.encode_commands` of register / heartbeat / elect / alter /
    configure / get / list."""
    first_unacknowledged: int = 0


class HAControllerResponse(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    results: bytes
    """`ha.controller_model.encode_results`: one result per command, in order."""


class HABrokerStatusRequest(msgspec.Struct, frozen=True, tag=True):
    """Ask a node about the broker it runs in broker group `group` (`quorumlog ha epochs`)."""

    request_id: int
    group: str


class HABrokerStatusResponse(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    status: bytes
    """JSON of `ha.broker_host.BrokerStatus` (role, epochs, offsets)."""


class PeerPing(msgspec.Struct, frozen=True, tag=True):
    """On a peer link: answer with a `PeerPong` carrying `sent_ns` back. The sender's own
    monotonic clock, so only the sender reads it (round-trip time metrics)."""

    sent_ns: int


class PeerPong(msgspec.Struct, frozen=True, tag=True):
    sent_ns: int


# --- auth ---------------------------------------------------------------------------------
#
# A client with credentials sends `Authenticate` once per connection and wraps every later
# request in `AuthenticatedRequest` with the token it got. Tokens live in the memory of the
# node that issued them (see `quorumlog.auth.guard`).


class Authenticate(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    user: str
    password: str


class AuthenticateResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    token: str
    """Empty when auth is off and nothing was checked: send requests unwrapped."""


class AuthenticatedRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    """The inner request's."""
    token: str
    request: ClientRequest
    """Answered under the request's own request_id (never another AuthenticatedRequest)."""


class AuthAdmin(msgspec.Struct, frozen=True, tag=True):
    """An auth command (`quorumlog.auth.commands`, JSON), numbered in the client's session
    like a KV write; answered with a KVWriteResult of one result."""

    request_id: int
    client_id: str
    sequence: int
    command: str
    first_unacknowledged: int = 0


class AuthQuery(msgspec.Struct, frozen=True, tag=True):
    """Read the auth state at the metadata leader: "status", "user_list", "user_get",
    "role_list" or "role_get" (the last two of `name`)."""

    request_id: int
    query: str
    name: str = ""


class AuthQueryResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    answer: str
    """JSON of the answer (`quorumlog.auth.service`)."""


# --- consumer groups: the group coordinator ----------------------------------------------
#
# As for the HA controller, the payloads are bytes encoded by `quorumlog.stream.group_model`
# (`encode_commands` / `encode_results`), which builds on this module.

GROUP_COORDINATOR_GROUP = "consumer-groups"


class GroupCoordinatorRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    commands: bytes
    """`stream.group_model.encode_commands` of join / leave / commit / reset / delete /
    describe / list."""


class GroupCoordinatorResponse(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    results: bytes
    """`stream.group_model.encode_results`: one result per command, in order."""


# --- the etcd v3-style KV (reads; writes are KVWrite commands with op "v3") -------------


class KVRangeRequest(msgspec.Struct, frozen=True, tag=True):
    """Keys in a range (`end` as in `codec.kv_v3`), at `revision` (0: now)."""

    request_id: int
    key: str
    end: str | None = None
    limit: int = 0
    keys_only: bool = False
    count_only: bool = False
    revision: int = 0
    stale: bool = False
    group: str = "kv"
    shards: list[int] | None = None
    """Sharded KV (group "shard-<gid>"): the one shard to read (revisions are per shard)."""


class KVRangeResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    kvs: list[KeyValue]
    more: bool
    count: int
    revision: int
    """The store's revision when it answered (not the one read at)."""
    failure: V3Failure | None = None
    """Set (and nothing read) when the revision was compacted or is in the future."""


class WatchPoll(msgspec.Struct, frozen=True, tag=True):
    """Events of keys in a range from `from_revision` on (0: from the next revision); the
    leader holds the answer up to `wait_ms` while there are none (a long poll)."""

    request_id: int
    key: str
    end: str | None = None
    from_revision: int = 0
    wait_ms: int = 0
    group: str = "kv"
    shards: list[int] | None = None
    """Sharded KV (group "shard-<gid>"): the one shard to watch (revisions are per shard)."""


class WatchPollResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    events: list[WatchEvent]
    revision: int
    """The store's revision when it answered: with no events, nothing in range changed up
    to it, so the next poll may start after it."""
    failure: V3Failure | None = None
    """Set when `from_revision` was compacted."""


class LeaseTimeToLiveRequest(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    lease_id: int
    keys: bool = False
    group: str = "kv"


class LeaseTimeToLiveResult(msgspec.Struct, frozen=True, tag=True):
    request_id: int
    lease_id: int
    ttl_seconds: int
    """Seconds left by the leader's clock; -1 if there is no such lease."""
    granted_ttl_seconds: int
    keys: list[str] = []


class ProduceMany(msgspec.Struct, frozen=True, tag=True):
    """Batches for several partitions in one frame, as Kafka's ProduceRequest carries one
    per broker: the producer sends the batches of one loop turn bound for one node together.

    Each part is served exactly as a `Produce` of its own and answered on its own, under its
    own request_id (a ProduceResult or an ErrorResponse, whenever its partition answers), so
    sequences, deduplication and errors stay per partition. A refusal of the frame as a whole
    (auth) is one ErrorResponse under this frame's request_id, which the client hands to
    every part."""

    request_id: int
    parts: list[Produce]


Frame = (
    Hello
    | Welcome
    | Refused
    | PeerBatch
    | KVWrite
    | KVRead
    | KVWriteResult
    | KVReadResult
    | KVScan
    | KVScanResult
    | ErrorResponse
    | StatusRequest
    | StatusResponse
    | MemberChangeRequest
    | TransferLeaderRequest
    | Done
    | CreateTopic
    | DeleteTopic
    | ListTopics
    | TopicList
    | Produce
    | ProduceResult
    | Fetch
    | FetchResult
    | PartitionStatusRequest
    | PartitionStatus
    | ControllerRequest
    | ControllerResponse
    | ShardGroupRequest
    | ShardGroupResponse
    | ShardStatusRequest
    | ShardStatusResponse
    | AddEntries
    | AddEntriesResult
    | ReadEntries
    | ReadEntriesResult
    | ReadLastAddConfirmed
    | LastAddConfirmedResult
    | DropLedger
    | HAControllerRequest
    | HAControllerResponse
    | HABrokerStatusRequest
    | HABrokerStatusResponse
    | PeerPing
    | PeerPong
    | Authenticate
    | AuthenticateResult
    | AuthenticatedRequest
    | AuthAdmin
    | AuthQuery
    | AuthQueryResult
    | GroupCoordinatorRequest
    | GroupCoordinatorResponse
    | KVRangeRequest
    | KVRangeResult
    | WatchPoll
    | WatchPollResult
    | LeaseTimeToLiveRequest
    | LeaseTimeToLiveResult
    | ProduceMany
)

ClientRequest = (
    KVWrite
    | KVRead
    | KVScan
    | StatusRequest
    | MemberChangeRequest
    | TransferLeaderRequest
    | CreateTopic
    | DeleteTopic
    | ListTopics
    | Produce
    | Fetch
    | PartitionStatusRequest
    | ControllerRequest
    | ShardGroupRequest
    | ShardStatusRequest
    | AddEntries
    | ReadEntries
    | ReadLastAddConfirmed
    | DropLedger
    | HAControllerRequest
    | HABrokerStatusRequest
    | Authenticate
    | AuthenticatedRequest
    | AuthAdmin
    | AuthQuery
    | GroupCoordinatorRequest
    | KVRangeRequest
    | WatchPoll
    | LeaseTimeToLiveRequest
    | ProduceMany
)

CLIENT_REQUEST_TYPES: tuple[type, ...] = (
    KVWrite,
    KVRead,
    KVScan,
    StatusRequest,
    MemberChangeRequest,
    TransferLeaderRequest,
    CreateTopic,
    DeleteTopic,
    ListTopics,
    Produce,
    Fetch,
    PartitionStatusRequest,
    ControllerRequest,
    ShardGroupRequest,
    ShardStatusRequest,
    AddEntries,
    ReadEntries,
    ReadLastAddConfirmed,
    DropLedger,
    HAControllerRequest,
    HABrokerStatusRequest,
    Authenticate,
    AuthenticatedRequest,
    AuthAdmin,
    AuthQuery,
    GroupCoordinatorRequest,
    KVRangeRequest,
    WatchPoll,
    LeaseTimeToLiveRequest,
    ProduceMany,
)

_batch_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(RecordBatch)


class RecordBatchVersion1(msgspec.Struct, frozen=True, array_like=True):
    """How an uncompressed RecordBatch is encoded: its first four fields, as before
    compression existed (so older readers read it, and its bytes did not change)."""

    producer_id: str
    base_sequence: int
    timestamp_ms: int
    records: list[Record]


def encode_record_batch(batch: RecordBatch) -> bytes:
    if batch.compression == "none":
        return _batch_encoder.encode(
            RecordBatchVersion1(
                batch.producer_id, batch.base_sequence, batch.timestamp_ms, batch.records
            )
        )
    return _batch_encoder.encode(batch)


def decode_record_batch(data: bytes) -> RecordBatch:
    batch: RecordBatch = _batch_decoder.decode(data)
    return batch


encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(Frame)


def encode(frame: Frame) -> bytes:
    return encoder.encode(frame)


DECODE_ERRORS: tuple[type[Exception], ...] = (
    msgspec.DecodeError,
    msgspec.ValidationError,
    UnicodeDecodeError,
)
"""What decoding bytes from outside may raise: msgspec raises UnicodeDecodeError, not a
DecodeError, for a string that is not UTF-8 (a type tag or any field). Catch all three
wherever such bytes are decoded: one missed is a frame that stops a node."""


def decode(payload: bytes | bytearray) -> Frame:
    """Decode one payload; raises one of `DECODE_ERRORS` on bad input."""
    frame: Frame = decoder.decode(payload)
    return frame
