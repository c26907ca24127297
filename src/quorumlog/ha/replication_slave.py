"""The slave side of a broker group's replication (reference 003, AutoSwitchHAClient).

Becoming slave (the constructor): the log ends at a whole message; epoch entries past its
end are dropped (see "Crash safety"). Then, per connection to the master:

1. handshake: send `HandshakeRequest`; the answer carries the master's epoch list and max
   offset. Compare the epoch lists from the back (`handshake.find_consistent_point`) and
   truncate the log there (to its start if no epoch matches), then the epoch file; ack the
   max offset, which is where the master starts transferring.
2. transfer: each batch must start at the slave's max offset. When its epoch differs from
   the last one in the epoch file, <epoch, epochStartOffset> is appended to the epoch file
   (durable) BEFORE the messages are appended: the epoch file is written before the offsets
   it describes are used. The messages are appended and the driver is asked to sync
   (`SlaveActions.sync`); it may sync off the loop and take further batches meanwhile.
   Acks carry the log's durable offset only (`CommitLog.durable_offset`, moved by a sync
   that returned), so the master may count every ack in confirmOffset: the driver calls
   `synced()` when a sync returned, which acks. Empty batches are heartbeats: they carry
   confirmOffset and are acked (with the durable offset), and never touch the epoch file.
   The handshake syncs the log before its ack: the master transfers from the acked
   offset, so that ack must be the log's end, and durable.

Crash safety of the handshake truncation. The log is truncated FIRST, the epoch file
second. A crash in between leaves epoch entries that start at or past the log's end: the
entries before them are intact, and every range is clamped to the log's end
(`epoch_file.epoch_ranges`), so the next handshake finds the same consistent point, or an
earlier one, and its `truncate_from` drops the leftovers (the constructor drops those
strictly past the end at once). The other order is unsafe: with the epoch file truncated
and the log not, the last remaining epoch would seem to cover the divergent tail, and the
next handshake could keep it. Each step alone is crash-safe: the store records a cut before
zeroing (mmap_store), the epoch file is replaced atomically.
"""

from __future__ import annotations

import enum

from quorumlog.errors import HAHandshakeRefusedError
from quorumlog.ha.commit_log import CommitLog
from quorumlog.ha.epoch_file import EpochFile
from quorumlog.ha.handshake import find_consistent_point
from quorumlog.ha.replication_actions import SlaveActions
from quorumlog.ha.wire import Ack, HAFrame, HandshakeRequest, HandshakeResponse, TransferBatch
from quorumlog.raft.invariants import require


class SlaveState(enum.Enum):
    READY = "ready"
    """Not connected (or the connection was lost): `connect` starts a handshake."""
    HANDSHAKE = "handshake"
    TRANSFER = "transfer"


class SlaveCore:
    """One broker following one master (for one MasterEpoch) over successive connections."""

    def __init__(
        self,
        *,
        broker_id: str,
        address: str,
        master_id: str,
        master_epoch: int,
        commit_log: CommitLog,
        epoch_file: EpochFile,
        async_learner: bool = False,
        confirm_offset: int = 0,
    ) -> None:
        self.broker_id = broker_id
        self.address = address
        self.master_id = master_id
        self.master_epoch = master_epoch
        """The MasterEpoch the controller named this master under; a master answering
        with an older one is stale."""
        self.commit_log = commit_log
        self.epoch_file = epoch_file
        self.async_learner = async_learner
        self.state = SlaveState.READY
        self.confirm_offset = confirm_offset
        """The master's confirmOffset as last heard (bounded by this log's end)."""
        self.last_truncation: tuple[int, int] | None = None
        """(max offset before, offset truncated to) of the last handshake, for events."""
        end = commit_log.truncate_to_last_whole_message()
        epoch_file.truncate_from(end + 1)
        self.confirm_offset = min(self.confirm_offset, end)

    def connect(self) -> SlaveActions:
        """A connection to the master is open: start the handshake."""
        self.state = SlaveState.HANDSHAKE
        request = HandshakeRequest(
            slave_id=self.broker_id,
            address=self.address,
            async_learner=self.async_learner,
            master_epoch=self.master_epoch,
            data_file_bytes=self.commit_log.data_file_bytes,
        )
        return SlaveActions(sends=[request])

    def connection_lost(self) -> None:
        self.state = SlaveState.READY

    def receive(self, frame: HAFrame) -> SlaveActions:
        """A frame from the master. Raises HAHandshakeRefusedError if the master refuses
        or cannot serve this slave (the driver reports it; following this master is over)."""
        if isinstance(frame, HandshakeResponse) and self.state is SlaveState.HANDSHAKE:
            return self._handshake(frame)
        if isinstance(frame, TransferBatch) and self.state is SlaveState.TRANSFER:
            return self._transfer(frame)
        reason = f"{type(frame).__name__} in state {self.state.value}"
        self.state = SlaveState.READY
        return SlaveActions(disconnect=reason)

    def _handshake(self, response: HandshakeResponse) -> SlaveActions:
        if response.refused is not None:
            raise HAHandshakeRefusedError(f"master {response.master_id}: {response.refused}")
        if response.master_epoch < self.master_epoch:
            raise HAHandshakeRefusedError(
                f"master {response.master_id} answers with MasterEpoch {response.master_epoch}, "
                f"older than {self.master_epoch}"
            )
        log = self.commit_log
        point = find_consistent_point(
            self.epoch_file.entries, log.max_offset, response.epochs, response.max_offset
        )
        target = log.min_offset if point is None else point
        if target < response.min_offset or target > response.max_offset:
            raise HAHandshakeRefusedError(
                f"master {response.master_id} holds [{response.min_offset}, "
                f"{response.max_offset}); this slave must continue from {target}"
            )
        before = log.max_offset
        log.truncate(target)  # the log first, then the epoch file: see the module docs
        self.epoch_file.truncate_from(target)
        log.sync()  # the ack below says durable up to the end (a sync may be in flight)
        self.last_truncation = (before, target)
        self.confirm_offset = min(self.confirm_offset, target)
        self.master_epoch = response.master_epoch
        self.state = SlaveState.TRANSFER
        return SlaveActions(sends=[Ack(log.max_offset)])

    def _transfer(self, batch: TransferBatch) -> SlaveActions:
        log = self.commit_log
        if batch.start_offset != log.max_offset:
            self.state = SlaveState.READY
            return SlaveActions(
                disconnect=f"batch at {batch.start_offset}, the log ends at {log.max_offset}"
            )
        require(
            batch.epoch <= self.master_epoch,
            f"a batch of epoch {batch.epoch} from the master of epoch {self.master_epoch}",
        )
        if batch.messages:
            self._record_epoch(batch)
            log.append(batch.messages, batch.epoch)
            require(
                log.max_offset == batch.end_offset,
                f"the batch [{batch.start_offset}, {batch.end_offset}) ends at "
                f"{log.max_offset} here: the commit log layouts differ",
            )
        self.confirm_offset = max(self.confirm_offset, min(batch.confirm_offset, log.max_offset))
        if batch.messages:
            return SlaveActions(sync=True)  # acked by `synced`, once durable
        return SlaveActions(sends=[Ack(log.durable_offset)])

    def synced(self) -> SlaveActions:
        """A sync of the log returned: ack what is durable now (nothing while no
        connection is transferring: the next handshake acks)."""
        if self.state is not SlaveState.TRANSFER:
            return SlaveActions()
        return SlaveActions(sends=[Ack(self.commit_log.durable_offset)])

    def _record_epoch(self, batch: TransferBatch) -> None:
        """A new epoch in the header goes to the epoch file (durable) before its offsets."""
        last = self.epoch_file.last
        if last is not None and last.epoch == batch.epoch:
            require(
                last.start_offset == batch.epoch_start_offset,
                f"epoch {batch.epoch} starts at {batch.epoch_start_offset} at the master, "
                f"at {last.start_offset} here",
            )
            return
        require(
            last is None or batch.epoch > last.epoch,
            f"a batch of epoch {batch.epoch} after epoch {last} (the handshake failed to cut)",
        )
        require(
            batch.epoch_start_offset == batch.start_offset,
            f"the first batch of epoch {batch.epoch} starts at {batch.start_offset}, "
            f"the epoch at {batch.epoch_start_offset}",
        )
        self.epoch_file.append(batch.epoch, batch.epoch_start_offset)


__all__ = ["SlaveCore", "SlaveState"]
