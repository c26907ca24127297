"""What the HA controller (reference 003) knows about broker groups, and what it is asked.

A broker group is one master and its slaves replicating a byte-offset commit log. The
controller, a Raft group, keeps per broker group: its brokers and their addresses, the
master (or none), the MasterEpoch (monotonic, issued only by the controller), and the
SyncStateSet (the brokers a new master may be elected from) with its own epoch.

`BrokerGroupInfo` is the controller's view of one group; it is what every command answers
with, so a broker learns of a new master from its next heartbeat. The commands are tagged
structs with the client's `sequence` LAST (defaulting to 0) so callers can build them
positionally without it; the client stamps the sequence that makes a retry idempotent.

A refused command answers `ok=False` with a `Refusal` code and a message; the client
turns the code into a typed error (`quorumlog.errors`, controller mode section).
"""

from __future__ import annotations

import enum

import msgspec


class BrokerInfo(msgspec.Struct, frozen=True):
    """One broker of a group, as the controller last heard of it."""

    broker_id: str
    address: str
    """Where the broker's HA service listens ("host:port"): slaves connect to the master's."""
    max_offset: int = 0
    """The end of the broker's commit log (bytes), from its last heartbeat."""
    epoch: int = 0
    """The last MasterEpoch in the broker's epoch file, from its last heartbeat."""
    last_heartbeat_ms: int = 0
    """The controller leader's stamp on the entry that carried the last heartbeat."""
    alive: bool = False
    """Heard from within the controller's heartbeat timeout, by the controller's clock (the
    stamp of the last entry applied) when this view was made."""


class BrokerGroupInfo(msgspec.Struct, frozen=True):
    """The controller's view of one broker group."""

    group: str
    brokers: list[BrokerInfo]
    """Sorted by broker id."""
    master_id: str | None
    """None when no master is elected (none yet, or none of the SyncStateSet is alive)."""
    master_epoch: int
    """0 before the first master; +1 with every election (also one that finds no master)."""
    sync_state_set: list[str]
    """The master first, then the others sorted by broker id."""
    sync_state_set_epoch: int
    allow_unclean_election: bool = False
    """Whether a master may be elected from outside the SyncStateSet (may lose acked data)."""


class Refusal(enum.Enum):
    """Why the controller refused a command (nothing changed)."""

    UNKNOWN_GROUP = "unknown_group"
    UNKNOWN_BROKER = "unknown_broker"
    NOT_MASTER = "not_master"
    """An AlterSyncStateSet from a broker that is not the group's current master."""
    STALE_MASTER_EPOCH = "stale_master_epoch"
    STALE_SYNC_STATE_SET_EPOCH = "stale_sync_state_set_epoch"
    INVALID_SYNC_STATE_SET = "invalid_sync_state_set"
    NO_ELIGIBLE_MASTER = "no_eligible_master"
    """No alive broker may be elected (none of the SyncStateSet, unless unclean allowed)."""
    BROKER_NOT_ELIGIBLE = "broker_not_eligible"
    """The broker an admin named is not alive, or not in the SyncStateSet."""
    MASTER_STILL_ALIVE = "master_still_alive"
    """An automatic election for a master that heartbeats again, or an election whose
    choice is the current master: nothing to do."""
    LIMIT_EXCEEDED = "limit_exceeded"
    BAD_REQUEST = "bad_request"


# --- commands ------------------------------------------------------------------------


class RegisterBroker(msgspec.Struct, frozen=True, array_like=True, tag="register"):
    """Add a broker to a group (creating the group), or update its address. Counts as a
    heartbeat. The first broker of a group that never had a master becomes its master."""

    group: str
    broker_id: str
    address: str
    sequence: int = 0


class BrokerHeartbeat(msgspec.Struct, frozen=True, array_like=True, tag="heartbeat"):
    """A broker is alive, with the end of its log and its last epoch (for electing the
    most caught-up). Answered with the group's info. Not deduplicated: a retry is only
    another heartbeat."""

    group: str
    broker_id: str
    max_offset: int
    epoch: int
    sequence: int = 0


class ElectMaster(msgspec.Struct, frozen=True, array_like=True, tag="elect"):
    """Elect a new master. Automatic (the controller leader found the master silent): only
    if the master is still silent when the entry applies. Admin: `broker_id` names the new
    master, or None lets the controller choose. `expected_master_epoch`, when set, makes
    the election happen only if the epoch is still that one, so two controller leaders
    that each saw the same silent master elect once."""

    group: str
    broker_id: str | None = None
    automatic: bool = False
    expected_master_epoch: int | None = None
    sequence: int = 0


class AlterSyncStateSet(msgspec.Struct, frozen=True, array_like=True, tag="alter_sss"):
    """The master shrinks or expands its SyncStateSet. Only the current master, with the
    current MasterEpoch and SyncStateSet epoch, may; the new set must hold the master and
    only registered brokers, and a broker it adds must be alive."""

    group: str
    master_id: str
    master_epoch: int
    sync_state_set_epoch: int
    new_set: list[str]
    sequence: int = 0


class ConfigureGroup(msgspec.Struct, frozen=True, array_like=True, tag="configure"):
    """Create a group if absent and set its election policy."""

    group: str
    allow_unclean_election: bool = False
    sequence: int = 0


class GetGroup(msgspec.Struct, frozen=True, array_like=True, tag="get_group"):
    """Read one group's info (a read: behind a ReadIndex round, never logged)."""

    group: str
    sequence: int = 0


class ListGroups(msgspec.Struct, frozen=True, array_like=True, tag="list_groups"):
    """Read every group's info, sorted by group name."""

    sequence: int = 0


HAControllerCommand = (
    RegisterBroker
    | BrokerHeartbeat
    | ElectMaster
    | AlterSyncStateSet
    | ConfigureGroup
    | GetGroup
    | ListGroups
)
HA_CONTROLLER_QUERY_TYPES: tuple[type, ...] = (GetGroup, ListGroups)


class HAControllerResult(msgspec.Struct, frozen=True):
    """One command's answer: the group after the command (or the groups, for a list)."""

    ok: bool
    refusal: Refusal | None = None
    error: str | None = None
    """Why the command was refused, when `ok` is False."""
    group: BrokerGroupInfo | None = None
    groups: list[BrokerGroupInfo] | None = None


# --- log entries ---------------------------------------------------------------------


class HAControllerBatch(msgspec.Struct, frozen=True, array_like=True):
    client_id: str
    first_unacknowledged: int
    """Every sequence below this one has its answer at the client (results may go)."""
    commands: list[HAControllerCommand]


class HAControllerEntry(msgspec.Struct, frozen=True, array_like=True):
    timestamp_ms: int
    """The proposing leader's wall clock: the only time the replicas see."""
    batches: list[HAControllerBatch]


_encoder = msgspec.msgpack.Encoder()
_entry_decoder = msgspec.msgpack.Decoder(HAControllerEntry)
_commands_decoder = msgspec.msgpack.Decoder(list[HAControllerCommand])
_results_decoder = msgspec.msgpack.Decoder(list[HAControllerResult])
_result_json_encoder = msgspec.json.Encoder()
_result_json_decoder = msgspec.json.Decoder(HAControllerResult)


def encode_entry(entry: HAControllerEntry) -> bytes:
    return _encoder.encode(entry)


def decode_entry(data: bytes) -> HAControllerEntry:
    """Raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _entry_decoder.decode(data)


def encode_commands(commands: list[HAControllerCommand]) -> bytes:
    """The `commands` of a wire.HAControllerRequest."""
    return _encoder.encode(commands)


def decode_commands(data: bytes) -> list[HAControllerCommand]:
    """Raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _commands_decoder.decode(data)


def encode_results(results: list[HAControllerResult]) -> bytes:
    """The `results` of a wire.HAControllerResponse."""
    return _encoder.encode(results)


def decode_results(data: bytes) -> list[HAControllerResult]:
    """Raises msgspec.DecodeError or ValidationError on bad bytes."""
    return _results_decoder.decode(data)


def result_to_text(result: HAControllerResult) -> str:
    """A result as the text a client session keeps (sessions store one string)."""
    return _result_json_encoder.encode(result).decode()


def result_from_text(text: str) -> HAControllerResult:
    return _result_json_decoder.decode(text)


__all__ = [
    "HA_CONTROLLER_QUERY_TYPES",
    "AlterSyncStateSet",
    "BrokerGroupInfo",
    "BrokerHeartbeat",
    "BrokerInfo",
    "ConfigureGroup",
    "ElectMaster",
    "GetGroup",
    "HAControllerBatch",
    "HAControllerCommand",
    "HAControllerEntry",
    "HAControllerResult",
    "ListGroups",
    "Refusal",
    "RegisterBroker",
    "decode_commands",
    "decode_entry",
    "decode_results",
    "encode_commands",
    "encode_entry",
    "encode_results",
    "result_from_text",
    "result_to_text",
]
