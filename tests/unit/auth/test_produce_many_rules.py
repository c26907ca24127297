"""A ProduceMany needs write on the topic of every part, as each Produce alone would."""

from __future__ import annotations

from quorumlog.auth.matcher import Rights
from quorumlog.auth.model import Access, Permission, PermissionKind, Role
from quorumlog.auth.rules import request_denial
from quorumlog.codec import wire


def part(request_id: int, topic: str) -> wire.Produce:
    return wire.Produce(
        request_id=request_id,
        topic=topic,
        partition=0,
        producer_id="p",
        base_sequence=0,
        records=[wire.Record(b"v")],
    )


WRITER = Rights(
    [Role(name="w", permissions=[Permission(PermissionKind.TOPIC, Access.WRITE, "orders")])],
    ["w"],
)


def test_every_part_needs_write_on_its_topic() -> None:
    allowed = wire.ProduceMany(request_id=-1, parts=[part(1, "orders"), part(2, "orders")])
    assert request_denial(WRITER, allowed) is None
    mixed = wire.ProduceMany(request_id=-2, parts=[part(3, "orders"), part(4, "payments")])
    assert "payments" in str(request_denial(WRITER, mixed))
    assert request_denial(Rights([], ["root"]), mixed) is None
