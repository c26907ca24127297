"""Commands find the local dev cluster without an export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quorumlog.cli.defaults import FALLBACK_ENDPOINTS, default_endpoints


def test_the_dev_cluster_started_here_is_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("QUORUMLOG_DEV_DIR", raising=False)
    assert default_endpoints() == FALLBACK_ENDPOINTS
    (tmp_path / ".quorumlog-dev").mkdir()
    state = {"endpoints": "127.0.0.1:4001,127.0.0.1:4002"}
    (tmp_path / ".quorumlog-dev" / "dev-cluster.json").write_text(json.dumps(state))
    assert default_endpoints() == "127.0.0.1:4001,127.0.0.1:4002"


def test_a_damaged_state_file_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUORUMLOG_DEV_DIR", str(tmp_path))
    (tmp_path / "dev-cluster.json").write_text("{not json")
    assert default_endpoints() == FALLBACK_ENDPOINTS
