"""A KV request as its client sees it, apart from how it travels: the frame a read or a
write sends, and how its answer is read.

`KVClient` builds and checks its requests with these, and so do the simulator's clients
(`testing/sim/workload.py`), so the simulator tests the request logic that ships.

A write is numbered in the client's session (`SessionCommand`): its sequence is allocated
when the call starts; every attempt sends it with the session's `first_unacknowledged` of
that moment; when the call ends the sequence is acknowledged, or, after an unknown
outcome, held so that repeating the same call reuses it (`SequenceTracker`).
"""

from __future__ import annotations

from quorumlog.codec.wire import (
    KVCommand,
    KVCommandResult,
    KVRead,
    KVReadResult,
    KVWrite,
    KVWriteResult,
)
from quorumlog.errors import ClientError, UnknownOutcomeError
from quorumlog.kv.connection import (
    ClientSession,
    CommandIdentity,
    check_command_result,
    write_results,
)

KV_GROUP = "kv"
"""The plain KV's group: what a request names when it names no other."""


def write_request(
    session: ClientSession,
    commands: list[KVCommand],
    request_id: int,
    group: str = KV_GROUP,
    internal: bool = False,
) -> KVWrite:
    """The frame one attempt of a write sends: the commands under the session's client id,
    with what the session has acknowledged so far (the cluster may forget those results)."""
    return KVWrite(
        request_id=request_id,
        client_id=session.client_id,
        commands=commands,
        first_unacknowledged=session.first_unacknowledged(),
        group=group,
        internal=internal,
    )


def read_request(key: str, request_id: int, stale: bool = False, group: str = KV_GROUP) -> KVRead:
    return KVRead(request_id=request_id, keys=[key], stale=stale, group=group)


def read_value(response: KVReadResult) -> str | None:
    """The one value a read of one key answered."""
    if len(response.values) != 1:
        raise ClientError(f"asked for 1 key, got {len(response.values)} values")
    return response.values[0]


class SessionCommand:
    """One write call numbered in a session, from its sequence to its result: what a client
    does around sending it, in steps (a blocking client takes them around one call, an
    event-driven one across callbacks)."""

    __slots__ = ("command", "identity", "session")

    def __init__(
        self,
        session: ClientSession,
        identity: CommandIdentity,
        now_seconds: float,
        payload: bytes | None = None,
    ) -> None:
        self.session = session
        self.identity = identity
        sequence = session.sequences.allocate(identity, now_seconds)
        if payload is None:
            self.command = KVCommand(sequence, *identity)
        else:
            # A v3 command: the identity names it (op, what, digest), the payload is it.
            self.command = KVCommand(sequence, identity[0], identity[1], payload=payload)

    def request(self, request_id: int, group: str = KV_GROUP) -> KVWrite:
        """The frame of one attempt (each attempt reads `first_unacknowledged` afresh)."""
        return write_request(self.session, [self.command], request_id, group)

    def answered(self, response: KVWriteResult, endpoint: str) -> KVCommandResult:
        """The sequence is acknowledged; the result as the caller sees it (ok=False is an
        answer only for "cas"). Raises SessionExpiredError if the cluster refused the write
        because it no longer has the session, RequestRejectedError on other refusals."""
        session = self.session
        session.sequences.acknowledge(self.command.sequence)
        [result] = write_results(response, 1, endpoint)
        session.answered = True
        return check_command_result(self.command, result)

    def failed(self, error: BaseException, now_seconds: float) -> None:
        """The call ended without an answer: after an unknown outcome its sequence is held
        for a retry of the same call (the cluster then applies it at most once); after
        any other error it is acknowledged (the cluster did not apply it)."""
        sequences = self.session.sequences
        if isinstance(error, UnknownOutcomeError):
            sequences.hold_unknown(self.command.sequence, self.identity, now_seconds)
        else:
            sequences.acknowledge(self.command.sequence)


__all__ = [
    "KV_GROUP",
    "SessionCommand",
    "read_request",
    "read_value",
    "write_request",
]


def prefix_end(prefix: str) -> str:
    """The first key after every key that starts with `prefix` (a non-empty prefix)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)
