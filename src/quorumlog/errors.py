"""Typed errors shared across quorumlog.

Every error a user can see derives from `QuorumLogError`, so `except QuorumLogError`
catches everything the library raises on purpose. Errors about bad arguments also derive
from the matching builtin (`ValueError`, `IndexError`) so ordinary Python habits work.
"""

from __future__ import annotations


class QuorumLogError(Exception):
    """Base of every error quorumlog raises on purpose."""


# --- storage -------------------------------------------------------------------------


class StorageError(QuorumLogError):
    """A log store could not do what was asked."""


class CorruptLogError(StorageError):
    """Data on disk fails a check: a bad checksum, a gap, or metadata pointing past the data.

    Never raised for a torn tail of the last file (that is cut off and reported); raised for
    damage to data that may have been acknowledged, so it must not be dropped silently.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt log: {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class DiskFullError(StorageError):
    """The disk has no room for the write. The store stays consistent; retry once space is back."""


class StoreClosedError(StorageError):
    """The store was closed."""


class DirectoryInUseError(StorageError):
    """Another open store (in this process or another) holds the directory's lock: two
    writers of one log would corrupt it."""


class LogIndexError(StorageError, IndexError):
    """An index outside the store's range [first_index, last_index]."""


class NonContiguousAppendError(StorageError, ValueError):
    """An append that does not start at last_index + 1, or whose indexes are not consecutive."""


class EntryTooLargeError(StorageError, ValueError):
    """An entry whose data is larger than the store's `entry_bytes_max`."""


class InvalidTruncateError(StorageError, ValueError):
    """A truncation outside what the store holds (for example below first_index)."""


class FormatVersionError(StorageError):
    """A data directory written in a format version this code does not read: refuse to start
    rather than misread it (or write the old format's files over)."""

    def __init__(self, path: str, found_version: int, supported_version: int) -> None:
        super().__init__(
            f"{path} holds format version {found_version}; "
            f"this program reads format version {supported_version}"
        )
        self.path = path
        self.found_version = found_version
        self.supported_version = supported_version


# --- consensus -----------------------------------------------------------------------


class RaftError(QuorumLogError):
    """A Raft group refused a request."""


class NotLeaderError(RaftError):
    """This node is not the leader; `leader_hint` names the leader it knows of, if any."""

    def __init__(self, node_id: str, leader_hint: str | None) -> None:
        hint = f"; try {leader_hint}" if leader_hint else "; no leader known"
        super().__init__(f"node {node_id} is not the leader{hint}")
        self.node_id = node_id
        self.leader_hint = leader_hint


class PendingFullError(RaftError):
    """The leader has as many uncommitted proposals as it may hold (DLedger LEADER_PENDING_FULL).

    Back off and retry: the request was not appended.
    """


class LeaderTransferringError(RaftError):
    """Leadership is being handed over; proposals are refused until it ends."""


class ConfigurationChangeInProgressError(RaftError):
    """A membership change is already in the log and not yet committed; one at a time."""


class InvalidConfigurationChangeError(RaftError, ValueError):
    """A membership change that makes no sense (remove a non-member, leave no voter, ...)."""


class ProposalDroppedError(RaftError):
    """The proposal was appended but replaced by another leader's entry: it did not happen."""


class LeaderNotReadyError(ConfigurationChangeInProgressError):
    """A new leader refuses membership changes until an entry of its own term commits.

    Until then a change an earlier leader began may still be in flight and commit, and a
    second one-server change on top of it could let two disjoint majorities each commit
    (Ongaro, raft-dev 2015, "bug in single-server membership changes"). Nothing was
    appended: retry shortly. It travels as CONFIGURATION_IN_PROGRESS, which clients retry.
    """


# --- clients -------------------------------------------------------------------------


class ClientError(QuorumLogError):
    """A client request failed."""


class UnavailableError(ClientError):
    """No node could serve the request in time (no leader, or no node reachable).

    Raised only when the request certainly did not take effect (it was never accepted).
    """


class UnknownOutcomeError(ClientError):
    """The request may or may not have taken effect (a timeout after it was sent).

    Retrying the same client call is safe for KV writes: sessions deduplicate it.
    """


class RequestRejectedError(ClientError):
    """The cluster refused the request (bad arguments, too large, wrong group, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ConnectionRefusedByNodeError(ClientError):
    """A node closed the connection at the handshake (wrong cluster id or protocol)."""


class SessionExpiredError(ClientError):
    """The cluster no longer has this client's session (it expired after idling, or was
    evicted to make room), so it cannot tell a retry from a new request: the request was
    refused and NOT carried out.

    Nothing sent under the old session can be made safe by retrying any more: a call that
    ended in UnknownOutcomeError may or may not have taken effect, and repeating it now
    would run it as a new request. The client starts a new session (a new client id, its
    sequences from 1) for its later calls, so it stays usable; whether to repeat the
    refused call is the caller's decision.
    """


class AuthenticationRequiredError(RequestRejectedError):
    """Auth is enabled and the request came without a valid token (no credentials, or an
    unknown user or wrong password at authentication). Never retried: only new
    credentials help."""

    def __init__(self, message: str, code: str = "authentication_required") -> None:
        super().__init__(code, message)


class PermissionDeniedError(RequestRejectedError):
    """The authenticated user's roles do not grant what the request needs (a key, a topic,
    or an admin right). Never retried: nothing was done."""

    def __init__(self, message: str) -> None:
        super().__init__("permission_denied", message)


class CompactedError(ClientError):
    """A KV read or watch asked for a revision the store has compacted away (its history
    starts after it): read at a later revision, or watch from a later one."""


class LeaseNotFoundError(ClientError, KeyError):
    """The KV lease named does not exist (never granted, revoked, or expired)."""


class LeadershipLostError(RaftError):
    """The leader lost its leadership before the proposal's fate was known: it may still
    commit under the next leader. Retry with the same client sequence (deduplicated)."""


class GroupFailedError(RaftError):
    """The group stopped on this node after a failure it must not work around (a violated
    invariant, an I/O error, a corrupt file): nothing more is persisted or sent here. The
    outcome of a request in flight is unknown; other nodes of the group may still serve."""

    def __init__(self, group_id: str, reason: str) -> None:
        super().__init__(f"group {group_id} stopped after a failure: {reason}")
        self.group_id = group_id
        self.reason = reason


class TLSHandshakeError(ClientError):
    """The TLS handshake with a node failed: the node's certificate is not trusted (wrong
    CA, wrong host name), the node refused ours (missing, or from a CA it does not trust),
    or one side speaks TLS and the other does not. Not retried: trying again or elsewhere
    would fail the same way until the certificates or settings change."""


class ReservedKeyError(RequestRejectedError):
    """A key starting with "__" is internal (topic descriptors, consumer offsets, ledger
    and bookie metadata, ...): the user KV API may read one by its name, but not write,
    delete or scan it; the cluster refused the request and did nothing."""

    def __init__(self, message: str) -> None:
        super().__init__("reserved_key", message)


class ShardMovedError(CompactedError):
    """A sharded KV watch (or read at a revision) asked for history its shard left behind
    when it moved to another group: the new owner's history starts at the revision the
    shard arrived with. Re-read the keys and watch again from a fresh revision."""


# --- controller mode (reference 003): broker-side HA replication ------------------------


class HAReplicationError(QuorumLogError):
    """Master/slave replication of a broker group could not do what was asked."""


class NotEnoughReplicasError(HAReplicationError):
    """The master's SyncStateSet is smaller than `min_in_sync`: a produce is refused (nothing
    written) rather than acknowledged by too few replicas."""

    def __init__(self, sync_state_set: list[str], min_in_sync: int) -> None:
        super().__init__(
            f"SyncStateSet {sync_state_set} has {len(sync_state_set)} members, "
            f"fewer than min_in_sync={min_in_sync}"
        )
        self.sync_state_set = sync_state_set
        self.min_in_sync = min_in_sync


class HAHandshakeRefusedError(HAReplicationError):
    """A master and a slave cannot replicate: different commit log layouts, a master that is
    stale for the slave, or a master whose log no longer starts where the slave's must."""


class MasterFencedError(HAReplicationError):
    """This broker is no longer its group's master (a newer MasterEpoch exists): it takes no
    more writes and acknowledges nothing more."""


class HAPendingFullError(HAReplicationError):
    """The master has as many produces waiting for the SyncStateSet as it may hold: this one
    is refused (nothing written) rather than queued without bound."""


class NotEnoughReplicasUnavailableError(UnavailableError, NotEnoughReplicasError):
    """What a client raises when the master kept refusing a produce with NOT_ENOUGH_REPLICAS
    until the request's timeout ran out (like Kafka's NotEnoughReplicasException): nothing
    was written. Both a NotEnoughReplicasError and an UnavailableError, so code that catches
    either sees it. The master's SyncStateSet and min_in_sync are in the message only (the
    wire carries text): `sync_state_set` is empty and `min_in_sync` 0 here."""

    def __init__(self, message: str) -> None:
        QuorumLogError.__init__(self, message)
        self.sync_state_set = []
        self.min_in_sync = 0


class HASyncFailedError(UnknownOutcomeError, HAReplicationError):
    """A broker's commit log failed a sync (an I/O error, a full disk): the kernel may have
    dropped what it was flushing, so the broker counts nothing more durable, steps out of its
    group (a master stops taking and acknowledging writes, a slave stops acking) and its
    controller heartbeats stop, so the controller elects a master from the SyncStateSet
    members still alive. A produce that was waiting for the failed broker may or may not be
    durable elsewhere: its outcome is unknown, and a retry with the same producer sequence
    is deduplicated by the new master. The broker serves again once its log is reopened
    (by the node after a full disk, or by a restart)."""

    def __init__(self, group: str, broker_id: str, reason: str, disk_full: bool = False) -> None:
        QuorumLogError.__init__(
            self, f"broker {broker_id} of {group} stepped out after a failed sync: {reason}"
        )
        self.group = group
        self.broker_id = broker_id
        self.reason = reason
        self.disk_full = disk_full
        """The sync failed for want of space (ENOSPC, EDQUOT): worth reopening later."""


# --- ledgers (reference 001) ---------------------------------------------------------


class LedgerError(QuorumLogError):
    """A ledger operation failed (BookKeeper-style ledgers on bookies)."""


class LedgerFencedError(LedgerError):
    """Another client fenced the ledger to recover it: this writer may add nothing more.

    Entries acknowledged before are safe (recovery keeps every one of them); entries still
    pending were not acknowledged and may or may not survive the recovery.
    """


class LedgerClosedError(LedgerError):
    """The ledger (or this handle) is closed: nothing more can be appended."""


class NotEnoughBookiesError(LedgerError):
    """Too few writable bookies to form (or repair) an ensemble of the asked size."""

    def __init__(self, needed: int, available: int) -> None:
        super().__init__(f"need {needed} writable bookies, {available} available")
        self.needed = needed
        self.available = available


class LedgerNotFoundError(LedgerError, KeyError):
    """No ledger has this id (it was never created, or it was deleted)."""

    def __init__(self, ledger_id: int) -> None:
        super().__init__(f"no ledger {ledger_id}")
        self.ledger_id = ledger_id

    def __str__(self) -> str:
        # KeyError would quote the message; show it as written.
        return str(self.args[0])


class BadPasswordError(LedgerError):
    """The password does not match the one the ledger was created with."""


class LedgerMetadataConflictError(LedgerError):
    """A metadata update expected a version that is no longer current (the compare-and-set
    failed): someone else changed the ledger's metadata. Re-read it and decide again."""

    def __init__(self, ledger_id: int, expected_version: int, actual_version: int) -> None:
        super().__init__(
            f"ledger {ledger_id}: metadata version is {actual_version}, "
            f"the update expected {expected_version}"
        )
        self.ledger_id = ledger_id
        self.expected_version = expected_version
        self.actual_version = actual_version


class LedgerMetadataFormatError(LedgerError, ValueError):
    """Stored ledger metadata that cannot be decoded (unknown format version, bad bytes)."""


class LedgerEntryRangeError(LedgerError, IndexError):
    """A read outside the entries a handle may read: beyond the last add confirmed, or an
    empty or negative range."""


class LedgerEntryUnavailableError(LedgerError):
    """No bookie of an entry's write set returned it, after every retry."""


class LedgerPendingFullError(LedgerError):
    """The writer holds as many unacknowledged entries (or bytes) as it may: nothing was
    appended. Wait for acknowledgements, then append again."""


class BookieRejectedError(LedgerError):
    """A bookie refused a request for a reason a retry elsewhere cannot fix (a malformed or
    oversized request)."""

    def __init__(self, bookie_id: str, status: str) -> None:
        super().__init__(f"bookie {bookie_id} refused the request: {status}")
        self.bookie_id = bookie_id
        self.status = status


class ManagedLedgerConflictError(LedgerError):
    """A managed ledger's record (its partition's ledger list) changed since it was read:
    the compare-and-set that would have replaced it failed."""

    def __init__(self, name: str, expected_version: int | None, actual_version: int | None) -> None:
        super().__init__(
            f"managed ledger {name}: record version is {actual_version}, "
            f"the update expected {expected_version}"
        )
        self.name = name
        self.expected_version = expected_version
        self.actual_version = actual_version


class NotPartitionOwnerError(LedgerError):
    """This managed ledger is no longer its partition's owner: another owner took over
    (fenced its ledger or changed its ledger list). Nothing more is appended here; the
    partition's current owner answers instead."""


# --- controller mode (reference 003): the HA controller ----------------------------------


class HAControllerRefusedError(QuorumLogError):
    """The HA controller refused a command (nothing changed). `code` is the controller's
    refusal code (`ha.controller_model.Refusal` values), `group` the broker group."""

    def __init__(self, code: str, message: str, group: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.group = group


class StaleHAEpochError(HAControllerRefusedError):
    """A request made under a MasterEpoch or SyncStateSet epoch that is no longer current,
    or from a broker that is no longer the master: re-read the group and decide again."""


class NoEligibleMasterError(HAControllerRefusedError):
    """No broker may be elected: none of the SyncStateSet is alive (and the group does not
    allow unclean election), or the broker named is not an alive member of it."""


class MasterStillAliveError(HAControllerRefusedError):
    """An election that would change nothing: the master is alive and stays master."""


class UnknownBrokerGroupError(HAControllerRefusedError, KeyError):
    """No such broker group, or no such broker registered in it."""

    def __str__(self) -> str:
        # KeyError would quote the message; show it as written.
        return str(self.args[0])


class InvalidSyncStateSetError(HAControllerRefusedError, ValueError):
    """A SyncStateSet that leaves out the master, repeats or names unknown brokers, or
    adds a broker that is not alive."""


# --- node configuration ----------------------------------------------------------------


class AdvertisedAddressError(QuorumLogError, ValueError):
    """A node or bookie would tell peers and clients an address nobody can dial: it
    listens on a wildcard address (0.0.0.0, ::) with no `--advertise`, or `--advertise`
    is itself a wildcard. It refuses to start rather than hand out such an address."""


class MissingExtraError(QuorumLogError, ImportError):
    """A command or module needs an optional extra that is not installed; the message is
    one line with the `pip install 'quorumlog[...]'` to run (quorumlog/extras.py)."""

    def __init__(self, message: str, extra: str, missing: list[str]) -> None:
        super().__init__(message)
        self.extra = extra
        self.missing = missing


class ClusterLevelError(QuorumLogError):
    """This node's feature level is below the level its cluster committed (a downgrade
    past it, or an old release joining an upgraded cluster): it refuses to start, join or
    apply rather than apply the log by older rules than the other replicas
    (codec/feature_levels.py). The message is one line naming both levels."""


# --- consumer groups -------------------------------------------------------------------


class GroupCoordinatorRefusedError(ClientError):
    """The consumer-group coordinator refused a command (nothing changed). `code` is its
    refusal code (`stream.group_model.Refusal` values), `group` the consumer group."""

    def __init__(self, code: str, message: str, group: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.group = group


class CommitFailedError(GroupCoordinatorRefusedError):
    """An offset commit the group refused: the member was removed from the group (its
    session timed out, or it left), the commit was made in an older generation, or it
    names a partition the member no longer owns. Kafka's CommitFailedException: the
    partitions went to another member, which reads on from the last accepted commit."""


class GroupNotEmptyError(GroupCoordinatorRefusedError):
    """Resetting offsets of or deleting a group with live members (stop them first), or
    committing to such a group from outside its membership."""


class UnknownConsumerGroupError(GroupCoordinatorRefusedError, KeyError):
    """No such consumer group."""

    def __str__(self) -> str:
        # KeyError would quote the message; show it as written.
        return str(self.args[0])


class GroupCoordinatorLoadingError(UnavailableError):
    """A new coordinator leader has not yet carried over the offsets the previous release
    kept in the "kv" group (Kafka's COORDINATOR_LOAD_IN_PROGRESS): nothing was done; retry
    shortly. Travels as UNAVAILABLE, which clients retry."""
