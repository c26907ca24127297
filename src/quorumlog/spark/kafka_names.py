"""Kafka client settings a Kafka job passes as `kafka.*` options, read as ours.

A job written for Spark's Kafka source says `.option("kafka.bootstrap.servers", ...)`;
with the format name changed to "quorumlog" (and the servers to quorumlog endpoints) it
runs unchanged: each spelling below is read as the quorumlog option beside it, with a
warning naming ours. Other `kafka.*` settings (security, group ids, ...) are not options of
this source and fail as any unknown option does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from quorumlog.spark.errors import OptionError

log = logging.getLogger("quorumlog.spark")

KAFKA_PREFIX = "kafka."
KAFKA_SPELLINGS = {
    "kafka.bootstrap.servers": "endpoints",
    "kafka.request.timeout.ms": "timeoutMs",
    "kafka.max.poll.records": "fetchRecordsMax",
    "kafka.max.partition.fetch.bytes": "fetchBytesMax",
}
"""Kafka's spelling (lower case, as Spark hands options over) → ours."""


def read_kafka_spellings(options: Mapping[str, str], known: tuple[str, ...]) -> dict[str, str]:
    """`options` with each Kafka spelling of a `known` option renamed to ours (warned once
    per option); OptionError if both spellings of one option are given."""
    known_lower = {name.lower(): name for name in known}
    renamed: dict[str, str] = {}
    for name, value in options.items():
        lowered = str(name).lower()
        ours = KAFKA_SPELLINGS.get(lowered)
        if ours is None or ours.lower() not in known_lower:
            renamed[lowered] = value
            continue
        if any(str(other).lower() == ours.lower() for other in options):
            raise OptionError(ours, f"given twice: as {ours!r} and as its Kafka spelling {name!r}")
        log.warning(
            "quorumlog option %r: read as %r (the Kafka spelling of it; use %r to silence this)",
            lowered,
            ours,
            ours,
        )
        renamed[ours.lower()] = value
    return renamed


def kafka_hint(name: str, known: tuple[str, ...]) -> str:
    """What to say about an unknown `kafka.*` option."""
    if not name.lower().startswith(KAFKA_PREFIX):
        return ""
    usable = sorted(
        spelling
        for spelling, ours in KAFKA_SPELLINGS.items()
        if ours.lower() in {option.lower() for option in known}
    )
    return (
        "; of the Kafka client settings, this format reads only "
        + (", ".join(usable) or "none")
        + " (quorumlog needs no other)"
    )
