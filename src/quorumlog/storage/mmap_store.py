"""Placeholder: being written."""

from __future__ import annotations

from typing import Any


class MmapLogStore:
    @classmethod
    def open(cls, path: Any, **options: Any) -> MmapLogStore:
        raise NotImplementedError
