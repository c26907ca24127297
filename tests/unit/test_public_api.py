"""The public names: each in `__all__` once and importable (httpx checks its API alike;
ruff's RUF022 keeps the order)."""

from __future__ import annotations

import importlib

import pytest

PUBLIC_MODULES = ["quorumlog", "quorumlog.testing", "quorumlog.storage"]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_imports_once(module_name: str) -> None:
    module = importlib.import_module(module_name)
    names = list(module.__all__)
    assert len(names) == len(set(names)), f"{module_name}.__all__ repeats a name"
    for name in names:
        assert getattr(module, name) is not None, f"{module_name}.{name}"


def test_the_clients_named_in_the_issues_are_top_level() -> None:
    import quorumlog

    for name in ("KVClient", "AsyncKVClient", "Producer", "Consumer", "Admin", "LedgerClient"):
        assert name in quorumlog.__all__
