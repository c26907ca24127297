"""Imported first by `quorumlog.spark`: without the Spark extra, the import fails with one
line naming the `pip install` to run, not a ModuleNotFoundError from inside pyspark."""

from __future__ import annotations

from quorumlog.extras import require_extra

require_extra("spark", "the quorumlog Spark format (quorumlog.spark)")
