"""A small deterministic key-value state machine, replicated by the simulated cluster.

Commands carry (client id, sequence): a client retries a command with the same sequence
until it learns the outcome, and the session table makes the retry a no-op that answers
with the first result. That is what makes client writes exactly-once on top of an
at-least-once log.
"""

from __future__ import annotations

import msgspec

from quorumlog.testing.sim.checks import SimulationError

Result = bool | None


class KvCommand(msgspec.Struct, frozen=True, array_like=True):
    client_id: int
    sequence: int
    kind: str
    """"put", "append", "delete", "cas", or "note" (no effect: a test's marker entry)."""
    key: str
    value: str = ""
    expected: str | None = None
    """For "cas": the value the key must hold (None: absent)."""


class _Session(msgspec.Struct, array_like=True):
    sequence: int
    result: Result


class _Snapshot(msgspec.Struct, array_like=True):
    data: list[tuple[str, str]]
    sessions: list[tuple[int, _Session]]


_command_encoder = msgspec.msgpack.Encoder()
_command_decoder = msgspec.msgpack.Decoder(KvCommand)
_snapshot_decoder = msgspec.msgpack.Decoder(_Snapshot)


def encode_command(command: KvCommand) -> bytes:
    return _command_encoder.encode(command)


def decode_command(data: bytes) -> KvCommand:
    return _command_decoder.decode(data)


class KvMachine:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.sessions: dict[int, _Session] = {}
        self.applied_commands = 0
        self.duplicate_commands = 0

    def apply(self, command: KvCommand) -> Result:
        """Apply a command once per (client, sequence); a retry gets the first result."""
        session = self.sessions.get(command.client_id)
        if session is not None and command.sequence <= session.sequence:
            self.duplicate_commands += 1
            # An older sequence than the last is a stale retry nobody waits for any more.
            return session.result if command.sequence == session.sequence else None
        result = self._execute(command)
        self.sessions[command.client_id] = _Session(command.sequence, result)
        self.applied_commands += 1
        return result

    def apply_bytes(self, data: bytes) -> Result:
        return self.apply(_command_decoder.decode(data))

    def _execute(self, command: KvCommand) -> Result:
        kind = command.kind
        if kind == "put":
            self.data[command.key] = command.value
            return None
        if kind == "append":
            self.data[command.key] = self.data.get(command.key, "") + command.value
            return None
        if kind == "delete":
            self.data.pop(command.key, None)
            return None
        if kind == "note":
            return None
        if kind == "cas":
            if self.data.get(command.key) != command.expected:
                return False
            self.data[command.key] = command.value
            return True
        raise SimulationError(f"unknown KV command kind {kind!r}")

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def snapshot(self) -> bytes:
        """The whole state, keys sorted so equal states give equal bytes."""
        snapshot = _Snapshot(
            data=sorted(self.data.items()),
            sessions=sorted(self.sessions.items()),
        )
        return _command_encoder.encode(snapshot)

    def restore(self, data: bytes) -> None:
        snapshot = _snapshot_decoder.decode(data)
        self.data = dict(snapshot.data)
        self.sessions = dict(snapshot.sessions)

    @classmethod
    def from_snapshot(cls, data: bytes) -> KvMachine:
        machine = cls()
        machine.restore(data)
        return machine
