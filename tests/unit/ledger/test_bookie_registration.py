"""The registrar keeps heartbeating through failures: an unreachable metadata group costs
one log line (not one per heartbeat), and registration resumes once it can be reached —
without the bookie or the loop ever waiting on it."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path

import pytest

from quorumlog.kv.client import KVClient
from quorumlog.ledger.bookie_registration import BookieRegistrar, RegistrationSettings
from quorumlog.ledger.registry import bookie_key, decode_bookie_record
from quorumlog.node.server import Node, NodeSettings

DEADLINE_SECONDS = 20.0


class StaticBookie:
    bookie_id = "b9"
    writable = True
    ledger_count = 3
    journal_bytes = 4096


def unreachable_address() -> str:
    """A loopback port nothing listens on (bound, then released: refused at once)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{held.getsockname()[1]}"


async def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_failed_heartbeats_log_once_and_registration_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        node = Node(
            NodeSettings(
                node_id="n1",
                listen="127.0.0.1:0",
                data_dir=str(tmp_path),
                tick_ms=5,
                election_ticks=2,
                fsync=False,
                bookie=False,
            )
        )
        await node.start()
        endpoints = [unreachable_address()]
        registrar = BookieRegistrar(
            StaticBookie(),
            lambda: "127.0.0.1:4181",
            lambda: list(endpoints),
            "quorumlog",
            RegistrationSettings(heartbeat_seconds=0.02, write_timeout_seconds=0.05),
        )
        try:
            registrar.start()
            await wait_for(lambda: registrar.failures >= 5, "five failed heartbeats")
            assert registrar.heartbeats == 0
            endpoints[:] = [node.addresses["n1"]]  # the metadata group comes within reach
            await wait_for(lambda: registrar.heartbeats >= 2, "heartbeats to succeed")
        finally:
            await registrar.stop()
            address = node.addresses["n1"]

            def stored() -> str | None:
                with KVClient([address], timeout=10.0) as client:
                    return client.get(bookie_key("b9"))

            value = await asyncio.to_thread(stored)
            await node.stop()
        record = decode_bookie_record(value or "")
        assert record is not None
        assert (record.address, record.ledgers, record.journal_bytes) == ("127.0.0.1:4181", 3, 4096)
        assert not record.writable  # the clean stop said so

    with caplog.at_level(logging.INFO, logger="quorumlog.bookie"):
        asyncio.run(scenario())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "could not register" in warnings[0].getMessage()
    assert any("registered again" in r.getMessage() for r in caplog.records)
