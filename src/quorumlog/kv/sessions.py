"""Client sessions: the replicated table that makes a retried KV command take effect once.

Each client names itself (a client id) and numbers its commands (sequences, from 1). A
session remembers, per client, the results of the commands it applied that the client may
still be waiting for: every sequence at or above the client's `first_unacknowledged`. A
command seen again — a sequence below `first_unacknowledged`, or one with a stored result —
is a duplicate: it is not applied again, and it gets the stored result (Raft dissertation
§6.3).

Sessions cannot be kept for ever: one idle for `session_ttl_ms` expires, and when
`session_count_max` clients have one, the least recently active is evicted. After that the
table cannot tell a retry of a command it applied from a new command, so it must not run
either (§6.3: the request of a client whose session is gone gets an error).

New client or dropped session
-----------------------------

A batch from a client that has a session is applied as above. A batch from a client that
has none is refused — every command answered `SESSION_EXPIRED_RESULT`, nothing applied,
no session created — when

1. the table remembers dropping that client's session: a dropped session leaves a small
   record (client id, when) for `expired_ttl_ms`, at most `expired_count_max` of them; or
2. the table's rule is `FIRST_SEQUENCE` and the batch's `first_unacknowledged` is above 1:
   the client says it holds answers for earlier sequences, so this table (or a session it
   no longer has) gave them. A client reports at most 1 until one of its writes has been
   answered (`codec.wire.KVWrite`; 0 is the default on the wire), so a client whose first
   writes all timed out is still new.

Otherwise it is a new client and gets a new session. The plain KV uses `FIRST_SEQUENCE`:
a client's sequences all go to its one table, so rule 2 refuses a dropped client for ever,
and rule 1 covers the one case rule 2 cannot see — a client whose session was dropped
before it got any answer, retrying its first commands. A shard group keeps one table per
shard while a client numbers its commands across all of them, so its first command to a
shard may carry any `first_unacknowledged`: shard tables use `NOT_REMEMBERED` (rule 1
only), and a client whose record has aged out of it gets a new session there. The shard
controller keeps the old behaviour (`UNCHECKED`: a missing session is a new one) until its
clients handle the error.

Everything here must decide identically on every replica, so nothing reads a clock:
time is the leader's stamp on each log entry, made monotonic (`clock_ms` never goes back
even if a new leader's clock is behind), and sessions are kept in order of last activity
(dropped ones in order of dropping) so expiry looks only at the front of that order.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import msgspec

from quorumlog.codec.wire import FIRST_SEQUENCE, ErrorCode, KVCommandResult
from quorumlog.raft.invariants import require

SESSION_TTL_MS_DEFAULT = 60 * 60 * 1000
SESSION_COUNT_MAX_DEFAULT = 100_000
SESSION_RESULTS_MAX_DEFAULT = 65_536
"""Results one session keeps. Our clients never keep more than their sequence window
(10,000) unanswered, so only a misbehaving client reaches this bound."""
EXPIRED_TTL_MS_DEFAULT = 24 * 60 * 60 * 1000
"""How long a dropped session is remembered (rule 1 of the module docstring)."""
EXPIRED_COUNT_MAX_DEFAULT = 100_000
"""Dropped sessions remembered at most; past it the oldest record is forgotten."""

FORGOTTEN_RESULT = KVCommandResult(ok=True, value=None)
"""The answer to a duplicate whose result was already released by the client."""
SESSION_EXPIRED_RESULT = KVCommandResult(ok=False, value=None, error=ErrorCode.SESSION_EXPIRED)
"""The answer to every command of a batch refused because its client's session is gone."""


class NewClientRule(enum.Enum):
    """How a table tells a new client from one whose session it dropped (module docstring)."""

    FIRST_SEQUENCE = "first_sequence"
    """Rules 1 and 2: for a table that sees all of a client's sequences (the plain KV)."""
    NOT_REMEMBERED = "not_remembered"
    """Rule 1 only: for a table that sees some of them (one shard of a shard group)."""
    UNCHECKED = "unchecked"
    """No check, nothing remembered: a client without a session always gets a new one."""


class Session(msgspec.Struct):
    last_active_ms: int
    first_unacknowledged: int = 0
    results: dict[int, KVCommandResult] = msgspec.field(default_factory=dict)


class SessionRecord(msgspec.Struct, frozen=True, array_like=True):
    """One session as a snapshot (or a moving shard) holds it; results sorted by sequence."""

    client_id: str
    last_active_ms: int
    """For a dropped session (`expired`): when it was dropped."""
    first_unacknowledged: int
    sequences: list[int]
    results: list[KVCommandResult]
    expired: bool = False
    """A dropped session, remembered so the client's next batch is refused (no results).
    A trailing field with a default: records written before it existed read as live."""


class SessionTable:
    """Sessions by client id, least recently active first (insertion order of the dict),
    and the clients whose sessions were dropped, earliest dropped first."""

    def __init__(
        self,
        session_ttl_ms: int = SESSION_TTL_MS_DEFAULT,
        session_count_max: int = SESSION_COUNT_MAX_DEFAULT,
        session_results_max: int = SESSION_RESULTS_MAX_DEFAULT,
        new_client_rule: NewClientRule = NewClientRule.UNCHECKED,
        expired_ttl_ms: int = EXPIRED_TTL_MS_DEFAULT,
        expired_count_max: int = EXPIRED_COUNT_MAX_DEFAULT,
    ) -> None:
        for name, bound in (
            ("session_ttl_ms", session_ttl_ms),
            ("session_count_max", session_count_max),
            ("session_results_max", session_results_max),
            ("expired_ttl_ms", expired_ttl_ms),
            ("expired_count_max", expired_count_max),
        ):
            if bound <= 0:
                raise ValueError(f"{name} must be positive, got {bound}")
        self.session_ttl_ms = session_ttl_ms
        self.session_count_max = session_count_max
        self.session_results_max = session_results_max
        self.new_client_rule = new_client_rule
        self.expired_ttl_ms = expired_ttl_ms
        self.expired_count_max = expired_count_max
        self.sessions: dict[str, Session] = {}
        self.expired: dict[str, int] = {}
        """Client id → when its session was dropped (entry time), earliest first. A client
        is in `sessions` or here, never both."""
        self.clock_ms = 0
        self.expired_count = 0
        self.evicted_count = 0

    def __len__(self) -> int:
        return len(self.sessions)

    def advance_clock(self, timestamp_ms: int) -> None:
        """Move time to an entry's stamp (never backwards) and expire idle sessions.

        Sessions are ordered by last activity and activity is stamped with the monotonic
        clock, so the idle ones are all at the front: expiry costs O(expired). The same
        holds for the records of dropped sessions, ordered by when they were dropped.
        """
        if timestamp_ms > self.clock_ms:
            self.clock_ms = timestamp_ms
        oldest_allowed_ms = self.clock_ms - self.session_ttl_ms
        sessions = self.sessions
        while sessions:
            client_id = next(iter(sessions))
            if sessions[client_id].last_active_ms >= oldest_allowed_ms:
                break
            del sessions[client_id]
            self.expired_count += 1
            self.remember_dropped(client_id)
        expired = self.expired
        oldest_remembered_ms = self.clock_ms - self.expired_ttl_ms
        while expired:
            client_id = next(iter(expired))
            if expired[client_id] >= oldest_remembered_ms:
                break
            del expired[client_id]

    def admits(self, client_id: str, first_unacknowledged: int) -> bool:
        """False if a batch from `client_id` must be refused: its session was dropped
        (the rules of the module docstring). Changes nothing."""
        if client_id in self.sessions:
            return True
        rule = self.new_client_rule
        if rule is NewClientRule.UNCHECKED:
            return True
        if client_id in self.expired:
            return False
        return rule is NewClientRule.NOT_REMEMBERED or first_unacknowledged <= FIRST_SEQUENCE

    def touch(self, client_id: str, first_unacknowledged: int) -> Session:
        """The session of `client_id`, made most recently active, created if missing (ask
        `admits` first: a client whose session was dropped must not get a new one).

        Results below `first_unacknowledged` are released: the client has their answers.
        """
        sessions = self.sessions
        session = sessions.pop(client_id, None)
        if session is None:
            require(
                client_id not in self.expired,
                f"a new session for {client_id!r}, whose session was dropped",
            )
            if len(sessions) >= self.session_count_max:
                self.evict_least_recent()
            session = Session(last_active_ms=self.clock_ms)
        session.last_active_ms = self.clock_ms
        sessions[client_id] = session
        if first_unacknowledged > session.first_unacknowledged:
            session.first_unacknowledged = first_unacknowledged
            results = session.results
            if results:
                for sequence in [s for s in results if s < first_unacknowledged]:
                    del results[sequence]
        return session

    def evict_least_recent(self) -> None:
        """Make room for one session: drop the least recently active (the front)."""
        sessions = self.sessions
        client_id = next(iter(sessions))
        del sessions[client_id]
        self.evicted_count += 1
        self.remember_dropped(client_id)

    def remember_dropped(self, client_id: str) -> None:
        """Record that `client_id`'s session is gone (now), unless the rule needs no record."""
        if self.new_client_rule is NewClientRule.UNCHECKED:
            return
        expired = self.expired
        expired.pop(client_id, None)  # re-dropped: move it to the back (latest)
        if len(expired) >= self.expired_count_max:
            del expired[next(iter(expired))]
        expired[client_id] = self.clock_ms

    def remember(self, session: Session, sequence: int, result: KVCommandResult) -> None:
        results = session.results
        results[sequence] = result
        if len(results) > self.session_results_max:
            # A client that never acknowledges: forget its lowest sequence and treat
            # everything below the next one as acknowledged, so a retry of a forgotten
            # command is never applied twice (at most once beats unbounded memory).
            lowest = min(results)
            del results[lowest]
            session.first_unacknowledged = max(session.first_unacknowledged, lowest + 1)

    def to_records(self) -> list[SessionRecord]:
        """Live sessions in activity order, then dropped ones in dropping order."""
        records = []
        for client_id, session in self.sessions.items():
            sequences = sorted(session.results)
            records.append(
                SessionRecord(
                    client_id=client_id,
                    last_active_ms=session.last_active_ms,
                    first_unacknowledged=session.first_unacknowledged,
                    sequences=sequences,
                    results=[session.results[sequence] for sequence in sequences],
                )
            )
        for client_id, dropped_ms in self.expired.items():
            records.append(dropped_record(client_id, dropped_ms))
        return records

    def load_records(self, clock_ms: int, records: list[SessionRecord]) -> None:
        sessions: dict[str, Session] = {}
        expired: dict[str, int] = {}
        for record in records:
            if len(record.sequences) != len(record.results):
                raise ValueError(
                    f"session {record.client_id!r}: {len(record.sequences)} sequences but "
                    f"{len(record.results)} results"
                )
            if record.client_id in sessions or record.client_id in expired:
                raise ValueError(f"session {record.client_id!r} appears twice")
            if record.expired:
                if record.sequences:
                    raise ValueError(f"dropped session {record.client_id!r} holds results")
                expired[record.client_id] = record.last_active_ms
                continue
            sessions[record.client_id] = Session(
                last_active_ms=record.last_active_ms,
                first_unacknowledged=record.first_unacknowledged,
                results=dict(zip(record.sequences, record.results, strict=True)),
            )
        self.sessions = sessions
        self.expired = expired
        self.clock_ms = clock_ms


def dropped_record(client_id: str, dropped_ms: int) -> SessionRecord:
    return SessionRecord(
        client_id=client_id,
        last_active_ms=dropped_ms,
        first_unacknowledged=0,
        sequences=[],
        results=[],
        expired=True,
    )


def lookup_duplicate(session: Session, sequence: int) -> KVCommandResult | None:
    """The stored answer if `sequence` was already applied for this session, else None."""
    if sequence < session.first_unacknowledged:
        return session.results.get(sequence, FORGOTTEN_RESULT)
    return session.results.get(sequence)


def is_session_expired(results: list[KVCommandResult]) -> bool:
    """True if a batch's results say it was refused because its session is gone (a node
    may answer such a batch with an ErrorResponse SESSION_EXPIRED instead)."""
    return any(result.error is ErrorCode.SESSION_EXPIRED for result in results)


CommandType = TypeVar("CommandType", covariant=True)
ResultType = TypeVar("ResultType")


class CommandBatch(Protocol[CommandType]):
    @property
    def client_id(self) -> str: ...

    @property
    def first_unacknowledged(self) -> int: ...

    @property
    def commands(self) -> Sequence[CommandType]: ...


def apply_deduplicated(
    sessions: SessionTable,
    batches: Sequence[CommandBatch[CommandType]],
    execute: Callable[[CommandType], ResultType],
    sequence_of: Callable[[CommandType], int | None],
    stored_from: Callable[[ResultType], KVCommandResult],
    result_from: Callable[[KVCommandResult], ResultType],
) -> tuple[list[list[ResultType]], int]:
    """Apply a log entry's client batches with at-most-once commands (the controllers'
    loop): each command whose `sequence_of` is not None runs once per (client, sequence);
    a retry gets the stored answer. Returns one result list per batch and how many
    commands were duplicates. `stored_from`/`result_from` convert a machine's result to and
    from what a session keeps."""
    all_results: list[list[ResultType]] = []
    duplicates = 0
    for batch in batches:
        session = sessions.touch(batch.client_id, batch.first_unacknowledged)
        batch_results: list[ResultType] = []
        for command in batch.commands:
            sequence = sequence_of(command)
            if sequence is None:
                batch_results.append(execute(command))
                continue
            stored = lookup_duplicate(session, sequence)
            if stored is not None:
                duplicates += 1
                batch_results.append(result_from(stored))
                continue
            result = execute(command)
            sessions.remember(session, sequence, stored_from(result))
            batch_results.append(result)
        all_results.append(batch_results)
    return all_results, duplicates
