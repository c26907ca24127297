"""Client sessions: the replicated table that makes a retried KV command take effect once.

Each client names itself (a client id) and numbers its commands (sequences). A session
remembers, per client, the results of the commands it applied that the client may still
be waiting for: every sequence at or above the client's `first_unacknowledged`. A command
seen again — a sequence below `first_unacknowledged`, or one with a stored result — is a
duplicate: it is not applied again, and it gets the stored result (Raft dissertation §6.3).

Everything here must decide identically on every replica, so nothing reads a clock:
time is the leader's stamp on each log entry, made monotonic (`clock_ms` never goes back
even if a new leader's clock is behind), and sessions are kept in order of last activity
so expiry and eviction look only at the front of that order.
"""

from __future__ import annotations

import msgspec

from quorumlog.codec.wire import KVCommandResult

SESSION_TTL_MS_DEFAULT = 60 * 60 * 1000
SESSION_COUNT_MAX_DEFAULT = 100_000
SESSION_RESULTS_MAX_DEFAULT = 65_536
"""Results one session keeps. Our clients never keep more than their sequence window
(10,000) unanswered, so only a misbehaving client reaches this bound."""

FORGOTTEN_RESULT = KVCommandResult(ok=True, value=None)
"""The answer to a duplicate whose result was already released by the client."""


class Session(msgspec.Struct):
    last_active_ms: int
    first_unacknowledged: int = 0
    results: dict[int, KVCommandResult] = msgspec.field(default_factory=dict)


class SessionRecord(msgspec.Struct, frozen=True, array_like=True):
    """One session as a snapshot holds it; results sorted by sequence."""

    client_id: str
    last_active_ms: int
    first_unacknowledged: int
    sequences: list[int]
    results: list[KVCommandResult]


class SessionTable:
    """Sessions by client id, least recently active first (insertion order of the dict)."""

    def __init__(
        self,
        session_ttl_ms: int = SESSION_TTL_MS_DEFAULT,
        session_count_max: int = SESSION_COUNT_MAX_DEFAULT,
        session_results_max: int = SESSION_RESULTS_MAX_DEFAULT,
    ) -> None:
        if session_ttl_ms <= 0:
            raise ValueError(f"session_ttl_ms must be positive, got {session_ttl_ms}")
        if session_count_max <= 0:
            raise ValueError(f"session_count_max must be positive, got {session_count_max}")
        if session_results_max <= 0:
            raise ValueError(f"session_results_max must be positive, got {session_results_max}")
        self.session_ttl_ms = session_ttl_ms
        self.session_count_max = session_count_max
        self.session_results_max = session_results_max
        self.sessions: dict[str, Session] = {}
        self.clock_ms = 0
        self.expired_count = 0
        self.evicted_count = 0

    def __len__(self) -> int:
        return len(self.sessions)

    def advance_clock(self, timestamp_ms: int) -> None:
        """Move time to an entry's stamp (never backwards) and expire idle sessions.

        Sessions are ordered by last activity and activity is stamped with the monotonic
        clock, so the idle ones are all at the front: expiry costs O(expired).
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

    def touch(self, client_id: str, first_unacknowledged: int) -> Session:
        """The session of `client_id`, made most recently active, created if missing.

        Results below `first_unacknowledged` are released: the client has their answers.
        """
        sessions = self.sessions
        session = sessions.pop(client_id, None)
        if session is None:
            if len(sessions) >= self.session_count_max:
                # Evict the least recently active client; the front of the order.
                del sessions[next(iter(sessions))]
                self.evicted_count += 1
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
        return records

    def load_records(self, clock_ms: int, records: list[SessionRecord]) -> None:
        sessions: dict[str, Session] = {}
        for record in records:
            if len(record.sequences) != len(record.results):
                raise ValueError(
                    f"session {record.client_id!r}: {len(record.sequences)} sequences but "
                    f"{len(record.results)} results"
                )
            sessions[record.client_id] = Session(
                last_active_ms=record.last_active_ms,
                first_unacknowledged=record.first_unacknowledged,
                results=dict(zip(record.sequences, record.results, strict=True)),
            )
        self.sessions = sessions
        self.clock_ms = clock_ms


def lookup_duplicate(session: Session, sequence: int) -> KVCommandResult | None:
    """The stored answer if `sequence` was already applied for this session, else None."""
    if sequence < session.first_unacknowledged:
        return session.results.get(sequence, FORGOTTEN_RESULT)
    return session.results.get(sequence)
