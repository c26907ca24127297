"""The invariants of controller mode (reference 003), checked while a seed runs and at its end.

- at most one master per MasterEpoch (among controller replicas and among brokers);
- MasterEpoch never goes back (in any controller replica; in any broker's role);
- a new master always comes from the SyncStateSet it was elected from (no unclean election
  is configured);
- no acknowledged message is lost: a broker becoming master holds every message acknowledged
  so far, and the final master holds them all; none is held twice;
- after handshake a slave's log is a prefix of its master's;
- epoch files agree where they overlap (an epoch both brokers record starts at the same
  offset in both).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorumlog.ha.commit_log import CommitLog
from quorumlog.ha.controller_machine import HAControllerMachine
from quorumlog.ha.epoch_file import EpochEntry
from quorumlog.testing.sim.checks import check_invariant

Message = tuple[int, bytes]
"""(epoch, message bytes) as the log holds it."""


def log_messages(log: CommitLog, end_offset: int | None = None) -> list[Message]:
    """Every message of `log` ending at or before `end_offset` (all by default)."""
    end = log.max_offset if end_offset is None else end_offset
    found: list[Message] = []
    position = log.min_offset
    while position < end and (batch := log.read_batch(position, 1 << 20)) is not None:
        found.extend((batch.epoch, message) for message in batch.messages)
        position = batch.end_offset
    return found


@dataclass
class HAChecker:
    masters_by_epoch: dict[int, str] = field(default_factory=dict)
    """MasterEpoch -> master, from every controller replica's applied state."""
    broker_masters_by_epoch: dict[int, str] = field(default_factory=dict)
    """MasterEpoch -> the broker that took mastership under it."""
    role_epochs: dict[str, int] = field(default_factory=dict)
    acknowledged: dict[bytes, int] = field(default_factory=dict)
    """Every acknowledged message -> the MasterEpoch of the master that acknowledged it."""
    checks: int = 0
    elections: int = 0
    handshakes: int = 0

    def check(self, condition: bool, message: str) -> None:
        self.checks += 1
        check_invariant(condition, message)

    # --- the controller ----------------------------------------------------------------

    def controller_applied(
        self, machine: HAControllerMachine, before: dict[str, tuple[str | None, int, list[str]]]
    ) -> None:
        for name, state in machine.groups.items():
            master_before, epoch_before, set_before = before.get(name, (None, 0, []))
            self.check(
                state.master_epoch >= epoch_before,
                f"{name}: MasterEpoch went back from {epoch_before} to {state.master_epoch}",
            )
            if state.master_epoch == epoch_before or state.master_id is None:
                continue
            new_epoch = state.master_epoch not in self.masters_by_epoch
            known = self.masters_by_epoch.setdefault(state.master_epoch, state.master_id)
            self.check(
                known == state.master_id,
                f"{name}: MasterEpoch {state.master_epoch} has two masters, {known} and "
                f"{state.master_id}",
            )
            if set_before and master_before != state.master_id:
                self.elections += new_epoch  # once per election, not once per replica
                self.check(
                    state.master_id in set_before,
                    f"{name}: {state.master_id} elected at MasterEpoch {state.master_epoch} "
                    f"from outside the SyncStateSet {set_before}",
                )

    # --- brokers -----------------------------------------------------------------------

    def role_taken(self, broker: str, epoch: int, is_master: bool, log: CommitLog | None) -> None:
        previous = self.role_epochs.get(broker, 0)
        self.check(epoch >= previous, f"{broker}: role epoch went back from {previous} to {epoch}")
        self.role_epochs[broker] = epoch
        if not is_master or log is None:
            return
        known = self.broker_masters_by_epoch.setdefault(epoch, broker)
        self.check(known == broker, f"MasterEpoch {epoch} mastered by {known} and {broker}")
        held = {message for _, message in log_messages(log)}
        missing = [message for message in self.acknowledged if message not in held]
        self.check(
            not missing,
            f"{broker} became master at MasterEpoch {epoch} without {len(missing)} acknowledged "
            f"messages (first {missing[:3]})",
        )

    def acknowledged_messages(self, epoch: int, messages: list[bytes]) -> None:
        for message in messages:
            self.acknowledged.setdefault(message, epoch)

    def handshake_done(
        self,
        slave: str,
        slave_log: CommitLog,
        slave_epochs: tuple[EpochEntry, ...],
        master: str,
        master_log: CommitLog,
        master_epochs: tuple[EpochEntry, ...],
    ) -> None:
        """The slave truncated after its handshake: its log is a prefix of the master's."""
        self.handshakes += 1
        ours = log_messages(slave_log)
        theirs = log_messages(master_log, None)[: len(ours)]
        self.check(
            ours == theirs,
            f"after handshake {slave}'s log ({len(ours)} messages) is not a prefix of master "
            f"{master}'s",
        )
        self.epochs_agree(slave, slave_epochs, master, master_epochs)

    def epochs_agree(
        self,
        first: str,
        first_epochs: tuple[EpochEntry, ...],
        second: str,
        second_epochs: tuple[EpochEntry, ...],
    ) -> None:
        starts = {entry.epoch: entry.start_offset for entry in second_epochs}
        for entry in first_epochs:
            other = starts.get(entry.epoch)
            self.check(
                other is None or other == entry.start_offset,
                f"epoch {entry.epoch} starts at {entry.start_offset} at {first}, at {other} "
                f"at {second}",
            )

    # --- the end -----------------------------------------------------------------------

    def final_log(self, master: str, log: CommitLog) -> int:
        """The final master's log holds every acknowledged message, each once."""
        messages = [message for _, message in log_messages(log)]
        self.check(
            len(messages) == len(set(messages)), f"{master}'s final log holds a message twice"
        )
        held = set(messages)
        missing = [message for message in self.acknowledged if message not in held]
        self.check(
            not missing,
            f"{len(missing)} acknowledged messages lost (first {missing[:3]}), final master "
            f"{master}",
        )
        return len(messages)
