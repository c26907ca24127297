"""Placeholder: being written."""

from __future__ import annotations


def run_storage_benchmark(as_json: bool, directory: str | None, quick: bool) -> None:
    raise NotImplementedError
