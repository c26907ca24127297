"""Each topic create gets a later stamp than the last one this node issued, so a topic
deleted and created again within one millisecond (or with the clock stepped back) is a new
incarnation: its partitions' group and ledger names differ from the old one's."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from quorumlog.node.stream_service import StreamService


def test_creates_within_one_millisecond_or_after_a_clock_step_back_get_later_stamps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    service = SimpleNamespace(last_created_ms=0)
    stamps = [StreamService.next_created_ms(service)]  # type: ignore[arg-type]
    stamps.append(StreamService.next_created_ms(service))  # type: ignore[arg-type]
    clock[0] = 999.0  # the clock stepped back
    stamps.append(StreamService.next_created_ms(service))  # type: ignore[arg-type]
    clock[0] = 2_000.0
    stamps.append(StreamService.next_created_ms(service))  # type: ignore[arg-type]
    assert stamps == [1_000_000, 1_000_001, 1_000_002, 2_000_000]
