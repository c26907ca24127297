"""How a node's log lines look: `--log-format text|json` and `--log-level`.

Both formats go through the standard `logging` module. JSON is one object per line
(`ts`, `level`, `logger`, `node`, `message`, plus an event's fields — `kind`, `group`,
`term`, `index`, ... — when the record carries one, see `obs/events.py`), so a log
shipper reads it without a parser of ours.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import TextIO

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "node": self.node_id,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if isinstance(event, dict):
            for key, value in event.items():
                fields.setdefault(str(key), value)
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        # default=str: an odd object in a message's arguments must not lose the line.
        return json.dumps(fields, default=str, ensure_ascii=False)


def text_formatter(node_id: str) -> logging.Formatter:
    return logging.Formatter(f"%(asctime)s {node_id} %(name)s %(levelname)s %(message)s")


def configure_logging(
    node_id: str, log_format: str = "text", level: str = "info", stream: TextIO | None = None
) -> None:
    """Send every log record at `level` or above to `stream` (stderr) in `log_format`."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(
        JsonFormatter(node_id) if log_format == "json" else text_formatter(node_id)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The level is the root's alone: a level left on quorumlog's own logger (the simulator
    # silences it) would filter records before they reach the handler.
    logging.getLogger("quorumlog").setLevel(logging.NOTSET)
