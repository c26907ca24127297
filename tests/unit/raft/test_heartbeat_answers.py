"""A follower answers a heartbeat at once, claiming only what is durable (raft/follower.py
`answer_heartbeat`): with many groups syncing on a busy disk, answers held back until the
follower's sync made leaders step down (check-quorum) although every follower was there."""

from __future__ import annotations

import random

from quorumlog.raft.config import RaftConfig
from quorumlog.raft.configuration import Configuration
from quorumlog.raft.core import RaftCore
from quorumlog.raft.messages import Push, PushKind, PushResponse
from quorumlog.raft.ready import HardState, Ready
from quorumlog.storage import LogEntry
from quorumlog.storage.memory import MemoryLogStore

LEADER = "n1"
FOLLOWER = "n2"
TERM = 3


def follower_in_term() -> tuple[RaftCore, MemoryLogStore]:
    store = MemoryLogStore()
    core = RaftCore(
        RaftConfig(node_id=FOLLOWER),
        store,
        hard_state=HardState(term=TERM),
        configuration=Configuration(voters=(LEADER, FOLLOWER, "n3")),
        random=random.Random(7),
    )
    return core, store


def push(kind: PushKind, **fields: object) -> Push:
    return Push(source=LEADER, target=FOLLOWER, term=TERM, kind=kind, round=1, **fields)  # type: ignore[arg-type]


def answers(messages: list[object]) -> list[PushResponse]:
    return [message for message in messages if isinstance(message, PushResponse)]


def persist(core: RaftCore, store: MemoryLogStore, ready: Ready) -> None:
    """What the host does once the Ready's sync landed."""
    if ready.entries:
        store.append(ready.entries)
        core.persisted(ready.entries[-1].index, ready.entries[-1].term)


def test_a_heartbeat_is_answered_at_once_with_only_the_durable_match() -> None:
    core, store = follower_in_term()
    core.step(push(PushKind.COMPARE))
    persist(core, store, core.ready())
    entries = [LogEntry(index=index, term=TERM, data=b"x") for index in (1, 2, 3)]
    core.step(push(PushKind.APPEND, index=0, index_term=0, entries=entries))
    appended = core.ready()
    assert appended.entries  # handed to the host: written, not yet synced
    assert answers(appended.messages) == []  # the APPEND's answer waits for the sync

    core.step(push(PushKind.COMMIT, read_sequence=5))
    heartbeat = core.ready()
    (answer,) = answers(heartbeat.messages)
    assert answers(heartbeat.messages_after_persist) == []
    assert answer.success and answer.read_sequence == 5
    assert answer.match_index == 0  # entries 1-3 are not durable: not claimed

    persist(core, store, appended)
    core.step(push(PushKind.COMMIT, read_sequence=6))
    (answer,) = answers(core.ready().messages)
    assert answer.match_index == 3


def test_a_heartbeat_that_brings_a_new_term_is_answered_after_persist() -> None:
    core, _ = follower_in_term()
    core.step(Push(source=LEADER, target=FOLLOWER, term=TERM + 1, kind=PushKind.COMMIT, round=1))
    ready = core.ready()
    assert ready.hard_state is not None and ready.hard_state.term == TERM + 1
    assert answers(ready.messages) == []
    (answer,) = answers(ready.messages_after_persist)
    assert answer.term == TERM + 1
