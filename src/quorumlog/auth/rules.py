"""Which right each client request needs, checked against a user's `Rights`.

- KV reads, writes and scans (of the "kv" group and of shard groups): read or write on
  each key, read on the whole scanned range. Internal keys: `__auth/` is never reachable
  through the KV for anyone but root's reads (auth commands write it); a topic's
  descriptor (`__topics/<topic>`) is readable with read or write on the topic, written
  only with the "topics" admin right; a group's offsets (`__offsets/<group>/<topic>/<p>`,
  consumer-group commits before the coordinator) need read on the topic. Other internal
  keys (ledgers, bookies, owners) are checked as ordinary keys: grant them to the users of
  LedgerClient.
- Produce: write on the topic (ProduceMany: on every part's topic); Fetch: read on the
  topic; partition status: either.
- Consumer groups (the coordinator): join, commit and reset need read on each topic named;
  delete needs the "topics" admin right (`group_coordinator_denial`).
- Topic creation and deletion: the "topics" admin right. Membership changes, leader
  transfers and shard controller changes (join, leave, move): the "membership" right.
- Topic lists, shard status and shard controller queries: any authenticated user
  (clients need them to find leaders and partitions); a group's status is served even
  without a token (`UNCHECKED_REQUEST_TYPES`).
- The bookie protocol and the HA controller's broker protocol are node-to-node and are not
  checked by role (`UNCHECKED_REQUEST_TYPES`).
- Any other request type is root's only (closed until a rule here names it).
"""

from __future__ import annotations

from quorumlog.auth.commands import AUTH_PREFIX
from quorumlog.auth.matcher import Rights
from quorumlog.auth.model import Access, AdminRight, PermissionKind, prefix_range_end
from quorumlog.codec import kv_v3, wire
from quorumlog.shard.controller_commands import Query, decode_commands

TOPIC_PREFIX = "__topics/"
OFFSETS_PREFIX = "__offsets/"
AUTH_RANGE_END = prefix_range_end(AUTH_PREFIX)

UNCHECKED_REQUEST_TYPES: tuple[type, ...] = (
    wire.AddEntries,
    wire.ReadEntries,
    wire.ReadLastAddConfirmed,
    wire.DropLedger,
    wire.HAControllerRequest,
    wire.HABrokerStatusRequest,
    wire.StatusRequest,
)
"""Served without a token: the bookie protocol (a ledger's master key guards its writes
and fencing; LedgerClient's metadata goes through the checked KV) and the HA controller's
broker protocol, both node-to-node (peer TLS is what keeps strangers off them); and a
group's status (roles, terms, indexes, addresses: no data), which health checks and
clients finding the leader ask before they authenticate, as etcd serves its status."""
OPEN_REQUEST_TYPES: tuple[type, ...] = (
    *UNCHECKED_REQUEST_TYPES,
    wire.ListTopics,
    wire.ShardStatusRequest,
)
"""What any authenticated user may send (clients need them to find leaders and
partitions). A request of a type no rule here names is root's only: a new request type
is closed until a rule says who may send it."""


def key_denial(rights: Rights, key: str, access: Access) -> str | None:
    """Why `key` may not be read or written; None if it may."""
    if key.startswith("__"):
        return internal_key_denial(rights, key, access)
    if rights.permits(PermissionKind.KEY, key, access):
        return None
    return f"no {access.value} permission on key {key!r}"


def internal_key_denial(rights: Rights, key: str, access: Access) -> str | None:
    if key.startswith(AUTH_PREFIX):
        if access is Access.READ and rights.is_root:
            return None
        return f"{key!r} is written only by auth commands, and read only by root"
    if key.startswith(TOPIC_PREFIX):
        topic = key[len(TOPIC_PREFIX) :]
        if access is Access.WRITE:
            return admin_denial(rights, AdminRight.TOPICS)
        if rights.permits(PermissionKind.TOPIC, topic, Access.READ) or rights.permits(
            PermissionKind.TOPIC, topic, Access.WRITE
        ):
            return None
        return f"no permission on topic {topic!r}"
    if key.startswith(OFFSETS_PREFIX):
        # "<group>/<topic>/<partition>": a group name has no "/".
        group_and_topic, _, _ = key[len(OFFSETS_PREFIX) :].rpartition("/")
        _, _, topic = group_and_topic.partition("/")
        if rights.permits(PermissionKind.TOPIC, topic, Access.READ):
            return None
        return f"no read permission on topic {topic!r} (group offsets)"
    if rights.permits(PermissionKind.KEY, key, access):
        return None
    return f"no {access.value} permission on key {key!r}"


def admin_denial(rights: Rights, right: AdminRight) -> str | None:
    return None if rights.has_admin(right) else f"the {right.value!r} admin right is needed"


def scan_denial(rights: Rights, start: str, end: str | None) -> str | None:
    if rights.is_root:
        return None
    # The auth state is never part of what a non-root scan may see.
    if start < AUTH_RANGE_END and (end is None or end > AUTH_PREFIX):
        return "a scan may not cover '__auth/' (the auth state)"
    if rights.permits_range(PermissionKind.KEY, start, end, Access.READ):
        return None
    shown = "the end" if end is None else repr(end)
    return f"no read permission on the whole range [{start!r}, {shown})"


def topic_denial(rights: Rights, topic: str, access: Access) -> str | None:
    if rights.permits(PermissionKind.TOPIC, topic, access):
        return None
    return f"no {access.value} permission on topic {topic!r}"


def controller_denial(rights: Rights, request: wire.ControllerRequest) -> str | None:
    try:
        commands = decode_commands(request.commands)
    except wire.DECODE_ERRORS:
        return None  # the controller answers BAD_REQUEST itself
    if all(isinstance(command, Query) for command in commands):
        return None
    return admin_denial(rights, AdminRight.MEMBERSHIP)


def group_coordinator_denial(rights: Rights, request: wire.GroupCoordinatorRequest) -> str | None:
    """Consumer groups (Kafka's ACLs, in our rights): joining, committing and resetting
    need read on each topic named; deleting a group, the "topics" admin right; leaving,
    describing and listing, any authenticated user; the coordinator leader's own commands
    (expiry, partition counts, offsets imported from the previous release), root (nodes)
    only: any command not named below falls to that refusal."""
    from quorumlog.stream import group_model

    try:
        commands = group_model.decode_commands(request.commands)
    except wire.DECODE_ERRORS:
        return None  # the coordinator answers BAD_REQUEST itself
    for command in commands:
        topics: list[str] = []
        if isinstance(command, group_model.JoinGroup):
            topics = command.topics
        elif isinstance(command, group_model.CommitOffsets | group_model.ResetOffsets):
            topics = sorted({offset.topic for offset in command.offsets})
        elif isinstance(command, group_model.DeleteGroup):
            denial = admin_denial(rights, AdminRight.TOPICS)
            if denial is not None:
                return denial
        elif not isinstance(
            command,
            group_model.LeaveGroup | group_model.DescribeGroup | group_model.ListGroups,
        ):
            return f"{type(command).__name__} is the group coordinator's own: only root"
        for topic in topics:
            denial = topic_denial(rights, topic, Access.READ)
            if denial is not None:
                return f"{denial} (consumer group {getattr(command, 'group', '')!r})"
    return None


def v3_range_denial(rights: Rights, key: str, end: str | None, access: Access) -> str | None:
    """A v3 range (`end` as codec/kv_v3.py reads it: None one key, "\\0" to the last)."""
    if end is None:
        return key_denial(rights, key, access)
    whole = None if end == kv_v3.RANGE_END_ALL else end
    if access is Access.READ:
        return scan_denial(rights, key, whole)
    if rights.is_root and not (key < AUTH_RANGE_END and (whole is None or whole > AUTH_PREFIX)):
        return None
    if not rights.is_root and rights.permits_range(PermissionKind.KEY, key, whole, access):
        return None
    return f"no write permission on the whole range from {key!r}"


def v3_write_denial(rights: Rights, payload: bytes | None) -> str | None:
    """A v3 write (etcd's txn, leases, compaction) checked on what it reads and writes:
    compares and gets need read, puts and deletes write; leases any authenticated user
    (as etcd); compaction root only. Not even root writes the auth state this way."""
    if payload is None:
        return None
    try:
        command = kv_v3.decode_command(payload)
    except wire.DECODE_ERRORS:
        return None  # the machine refuses it
    if isinstance(command, kv_v3.Compact):
        return None if rights.is_root else "only root may compact the KV's history"
    if not isinstance(command, kv_v3.Txn):
        return None
    for compare in command.compares:
        if not rights.is_root:
            denial = key_denial(rights, compare.key, Access.READ)
            if denial is not None:
                return denial
    for operation in (*command.success, *command.failure):
        if operation.kind == "get":
            if rights.is_root:
                continue
            denial = v3_range_denial(rights, operation.key, operation.end, Access.READ)
        else:
            denial = v3_range_denial(rights, operation.key, operation.end, Access.WRITE)
        if denial is not None:
            return denial
    return None


def request_denial(rights: Rights, request: wire.ClientRequest) -> str | None:
    """Why `rights` do not allow `request`; None if they do."""
    if isinstance(request, wire.KVWrite):
        # Before root's shortcut: not even root writes the auth state through the KV.
        for command in request.commands:
            if command.op == kv_v3.V3_OP:
                denial = v3_write_denial(rights, command.payload)
            else:
                denial = key_denial(rights, command.key, Access.WRITE)
            if denial is not None:
                return denial
        return None
    if rights.is_root:
        return None
    if isinstance(request, wire.KVRangeRequest | wire.WatchPoll):
        return v3_range_denial(rights, request.key, request.end, Access.READ)
    if isinstance(request, wire.LeaseTimeToLiveRequest):
        return None
    if isinstance(request, wire.KVRead):
        for key in request.keys:
            denial = key_denial(rights, key, Access.READ)
            if denial is not None:
                return denial
        return None
    if isinstance(request, wire.KVScan):
        return scan_denial(rights, request.start, request.end)
    if isinstance(request, wire.Produce):
        return topic_denial(rights, request.topic, Access.WRITE)
    if isinstance(request, wire.ProduceMany):
        for part in request.parts:
            denial = topic_denial(rights, part.topic, Access.WRITE)
            if denial is not None:
                return denial
        return None
    if isinstance(request, wire.Fetch):
        return topic_denial(rights, request.topic, Access.READ)
    if isinstance(request, wire.PartitionStatusRequest):
        if topic_denial(rights, request.topic, Access.WRITE) is None:
            return None
        return topic_denial(rights, request.topic, Access.READ)
    if isinstance(request, wire.CreateTopic | wire.DeleteTopic):
        return admin_denial(rights, AdminRight.TOPICS)
    if isinstance(request, wire.MemberChangeRequest | wire.TransferLeaderRequest):
        return admin_denial(rights, AdminRight.MEMBERSHIP)
    if isinstance(request, wire.ControllerRequest):
        return controller_denial(rights, request)
    if isinstance(request, wire.ShardGroupRequest):
        # Pulls and deletes between shard groups carry whole shards: nodes only.
        return admin_denial(rights, AdminRight.MEMBERSHIP)
    if isinstance(request, wire.GroupCoordinatorRequest):
        return group_coordinator_denial(rights, request)
    if isinstance(request, OPEN_REQUEST_TYPES):
        return None
    return f"no permission rule covers {type(request).__name__}: only root may send it"


__all__ = [
    "OPEN_REQUEST_TYPES",
    "UNCHECKED_REQUEST_TYPES",
    "key_denial",
    "request_denial",
    "scan_denial",
]
