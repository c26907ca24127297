"""Placeholder: being written."""

from __future__ import annotations

from typing import Any


class SegmentLogStore:
    @classmethod
    def open(cls, path: Any, **options: Any) -> SegmentLogStore:
        raise NotImplementedError
