"""Cluster membership: who votes, who only learns, and how changes are encoded in the log."""

from __future__ import annotations

import enum

import msgspec

from quorumlog.errors import InvalidConfigurationChangeError


class Configuration(msgspec.Struct, frozen=True, array_like=True):
    """Voters decide elections and commits; learners receive the log but never count."""

    voters: tuple[str, ...]
    learners: tuple[str, ...] = ()
    addresses: tuple[tuple[str, str], ...] = ()
    """(node id, "host:port") for members whose address the cluster learned by a change."""

    def address_of(self, node_id: str) -> str | None:
        for member, address in self.addresses:
            if member == node_id:
                return address
        return None

    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def is_voter(self, node_id: str) -> bool:
        return node_id in self.voters


class ChangeKind(enum.Enum):
    ADD_VOTER = "add_voter"
    ADD_LEARNER = "add_learner"
    PROMOTE_LEARNER = "promote_learner"
    REMOVE = "remove"


class MembershipChange(msgspec.Struct, frozen=True):
    """One change at a time (Raft dissertation §4.1): any two majorities still overlap."""

    kind: ChangeKind
    node_id: str
    address: str | None = None
    """Where the new member listens ("host:port"), so every node can reach it."""


def apply_change(configuration: Configuration, change: MembershipChange) -> Configuration:
    """The configuration after `change`, or InvalidConfigurationChangeError."""
    voters = list(configuration.voters)
    learners = list(configuration.learners)
    node = change.node_id
    if change.kind is ChangeKind.ADD_VOTER:
        if node in voters:
            raise InvalidConfigurationChangeError(f"{node} is already a voter")
        if node in learners:
            learners.remove(node)
        voters.append(node)
    elif change.kind is ChangeKind.ADD_LEARNER:
        if node in voters or node in learners:
            raise InvalidConfigurationChangeError(f"{node} is already a member")
        learners.append(node)
    elif change.kind is ChangeKind.PROMOTE_LEARNER:
        if node not in learners:
            raise InvalidConfigurationChangeError(f"{node} is not a learner")
        learners.remove(node)
        voters.append(node)
    elif change.kind is ChangeKind.REMOVE:
        if node in voters:
            if len(voters) == 1:
                raise InvalidConfigurationChangeError(f"cannot remove {node}, the last voter")
            voters.remove(node)
        elif node in learners:
            learners.remove(node)
        else:
            raise InvalidConfigurationChangeError(f"{node} is not a member")
    addresses = dict(configuration.addresses)
    if change.address is not None:
        addresses[node] = change.address
    members = set(voters) | set(learners)
    return Configuration(
        voters=tuple(sorted(voters)),
        learners=tuple(sorted(learners)),
        addresses=tuple(sorted((m, a) for m, a in addresses.items() if m in members)),
    )


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Configuration)


def encode_configuration(configuration: Configuration) -> bytes:
    return _encoder.encode(configuration)


def decode_configuration(data: bytes) -> Configuration:
    return _decoder.decode(data)
