"""HAControllerClient: the blocking client of the HA controller (reference 003).

    from quorumlog.ha.controller_client import HAControllerClient

    with HAControllerClient(["127.0.0.1:2379"]) as controller:  # any nodes of the cluster
        info = controller.register("broker-a", "n1", "127.0.0.1:7001")
        info = controller.heartbeat("broker-a", "n1", max_offset=4096, epoch=info.master_epoch)
        controller.elect_master("broker-a", broker_id="n2")  # an admin switch-over

Brokers register, then heartbeat; every answer is the group's `BrokerGroupInfo`, so a
broker learns a new master from its next heartbeat. The master shrinks and expands its
SyncStateSet with `alter_sync_state_set`. A refusal raises a typed error (the controller
mode section of `quorumlog.errors`); nothing changed then.

It rides on `KVClient`'s plumbing: it finds the controller's leader and follows NOT_LEADER
hints. Register, elections, alters and configuration carry a sequence, so a retry after a
lost answer is applied once; heartbeats and reads carry none (a repeat is harmless).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from quorumlog.codec import wire
from quorumlog.errors import (
    ClientError,
    HAControllerRefusedError,
    InvalidSyncStateSetError,
    MasterStillAliveError,
    NoEligibleMasterError,
    StaleHAEpochError,
    UnknownBrokerGroupError,
)
from quorumlog.ha.broker_host import BrokerStatus
from quorumlog.ha.controller_model import (
    AlterSyncStateSet,
    BrokerGroupInfo,
    BrokerHeartbeat,
    ConfigureGroup,
    ElectMaster,
    GetGroup,
    HAControllerCommand,
    HAControllerResult,
    ListGroups,
    Refusal,
    RegisterBroker,
    decode_results,
    encode_commands,
)
from quorumlog.kv.client import KVClient, tracked_sequence
from quorumlog.kv.connection import CommandIdentity

REFUSAL_ERRORS: dict[Refusal, type[HAControllerRefusedError]] = {
    Refusal.UNKNOWN_GROUP: UnknownBrokerGroupError,
    Refusal.UNKNOWN_BROKER: UnknownBrokerGroupError,
    Refusal.NOT_MASTER: StaleHAEpochError,
    Refusal.STALE_MASTER_EPOCH: StaleHAEpochError,
    Refusal.STALE_SYNC_STATE_SET_EPOCH: StaleHAEpochError,
    Refusal.INVALID_SYNC_STATE_SET: InvalidSyncStateSetError,
    Refusal.NO_ELIGIBLE_MASTER: NoEligibleMasterError,
    Refusal.BROKER_NOT_ELIGIBLE: NoEligibleMasterError,
    Refusal.MASTER_STILL_ALIVE: MasterStillAliveError,
}


def refusal_error(result: HAControllerResult, group: str | None) -> HAControllerRefusedError:
    """The typed error for a refused result."""
    refusal = result.refusal or Refusal.BAD_REQUEST
    error_type = REFUSAL_ERRORS.get(refusal, HAControllerRefusedError)
    return error_type(refusal.value, result.error or "refused", group)


class HAControllerClient(KVClient):
    """A blocking client of the HA controller group. See the module docstring."""

    # --- brokers ------------------------------------------------------------------------

    def register(self, group: str, broker_id: str, address: str) -> BrokerGroupInfo:
        """Register (or re-address) a broker; the first of a new group becomes master."""
        return self.logged_group_write(RegisterBroker(group, broker_id, address))

    def heartbeat(self, group: str, broker_id: str, max_offset: int, epoch: int) -> BrokerGroupInfo:
        command = BrokerHeartbeat(group, broker_id, max_offset, epoch)
        return self.group_of(self.send(f"heartbeat {group}/{broker_id}", command, 0), group)

    def alter_sync_state_set(
        self,
        group: str,
        master_id: str,
        master_epoch: int,
        sync_state_set_epoch: int,
        new_set: list[str],
    ) -> BrokerGroupInfo:
        """Replace the SyncStateSet; the answer holds the new set and its epoch. Raises
        StaleHAEpochError if `master_id` is not the master at these epochs any more."""
        return self.logged_group_write(
            AlterSyncStateSet(group, master_id, master_epoch, sync_state_set_epoch, new_set)
        )

    # --- administration -------------------------------------------------------------------

    def elect_master(self, group: str, broker_id: str | None = None) -> BrokerGroupInfo:
        """Make `broker_id` (an alive SyncStateSet member) master, or let the controller
        choose when the master is gone."""
        return self.logged_group_write(ElectMaster(group, broker_id))

    def configure_group(self, group: str, allow_unclean_election: bool) -> BrokerGroupInfo:
        return self.logged_group_write(ConfigureGroup(group, allow_unclean_election))

    def get_group(self, group: str) -> BrokerGroupInfo:
        return self.group_of(self.send(f"get {group}", GetGroup(group), None), group)

    def broker_status(self, group: str, broker_id: str) -> BrokerStatus:
        """The broker's own report (role, offsets, epoch file), asked of its node: the
        node's client address comes from the cluster's status (broker id = node id)."""
        addresses = self.status().addresses
        endpoint = addresses.get(broker_id)
        if endpoint is None:
            raise UnknownBrokerGroupError(
                Refusal.UNKNOWN_BROKER.value, f"no node {broker_id!r} in the cluster", group
            )
        response = self.call(
            f"broker status {group}/{broker_id}",
            lambda request_id: wire.HABrokerStatusRequest(request_id=request_id, group=group),
            wire.HABrokerStatusResponse,
            side_effects=False,
            at_leader=False,
            endpoint=endpoint,
        )
        try:
            return msgspec.json.decode(response.status, type=BrokerStatus)
        except wire.DECODE_ERRORS as error:
            raise ClientError(f"broker status of {broker_id}: {error}") from error

    def list_groups(self) -> list[BrokerGroupInfo]:
        result = self.send("list broker groups", ListGroups(), None)
        if not result.ok:
            raise refusal_error(result, None)
        return list(result.groups or [])

    # --- requests -------------------------------------------------------------------------

    def logged_group_write(
        self, command: RegisterBroker | ElectMaster | AlterSyncStateSet | ConfigureGroup
    ) -> BrokerGroupInfo:
        """Send a deduplicated write under this client's next sequence (or the one held
        for the same call after an unknown outcome)."""
        what = f"{type(command).__name__} {command.group}"
        with self.lock, tracked_sequence(self.sequences, write_identity(command)) as sequence:
            numbered = msgspec.structs.replace(command, sequence=sequence)
            result = self.send(what, numbered, self.session.first_unacknowledged())
            self.session.answered = True
        if result.ok and result.group is None:
            # A duplicate whose answer the controller already let go: it did happen.
            return self.get_group(command.group)
        return self.group_of(result, command.group)

    def send(
        self, what: str, command: HAControllerCommand, first_unacknowledged: int | None
    ) -> HAControllerResult:
        """One command; `first_unacknowledged` None marks a read (no side effects)."""
        response = self.call(
            what,
            controller_request(command, self.client_id, first_unacknowledged or 0),
            wire.HAControllerResponse,
            side_effects=first_unacknowledged is not None,
        )
        return single_result(what, response)

    def group_of(self, result: HAControllerResult, group: str) -> BrokerGroupInfo:
        if not result.ok:
            raise refusal_error(result, group)
        if result.group is None:
            raise ClientError(f"the controller answered for {group!r} without the group")
        return result.group


# --- shared with the brokers' event-driven access (node/ha_controller_access.py) ----------

LoggedWrite = RegisterBroker | ElectMaster | AlterSyncStateSet | ConfigureGroup
"""The commands the controller deduplicates by (client id, sequence)."""


def write_identity(command: LoggedWrite) -> CommandIdentity:
    """What makes two logged writes the same call: a retry of it after an unknown outcome
    reuses its sequence (`SequenceTracker.hold_unknown`), so it is applied once."""
    return (type(command).__name__, command.group, msgspec.json.encode(command).decode(), None)


def controller_request(
    command: HAControllerCommand, client_id: str, first_unacknowledged: int
) -> Callable[[int], wire.HAControllerRequest]:
    """The request carrying one command, for any request id (each attempt has its own)."""
    commands = encode_commands([command])

    def make_request(request_id: int) -> wire.HAControllerRequest:
        return wire.HAControllerRequest(
            request_id=request_id,
            client_id=client_id,
            commands=commands,
            first_unacknowledged=first_unacknowledged,
        )

    return make_request


def single_result(what: str, response: wire.HAControllerResponse) -> HAControllerResult:
    """The one result of a one-command request; ClientError if the answer is malformed."""
    try:
        results = decode_results(response.results)
    except wire.DECODE_ERRORS as error:
        raise ClientError(f"{what}: the answer does not decode: {error}") from error
    if len(results) != 1:
        raise ClientError(f"{what}: {len(results)} results for one command")
    return results[0]


__all__ = [
    "REFUSAL_ERRORS",
    "HAControllerClient",
    "LoggedWrite",
    "controller_request",
    "refusal_error",
    "single_result",
    "write_identity",
]
