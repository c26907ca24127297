"""The node's log formats: JSON is one object per line with the event's fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from quorumlog.obs.events import EventLog
from quorumlog.obs.log_format import JsonFormatter, configure_logging


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("quorumlog.test", logging.WARNING, __file__, 1, message, args, None)
    for key, value in extra.items():
        setattr(made, key, value)
    return made


def test_a_record_is_one_json_object_on_one_line() -> None:
    line = JsonFormatter("n1").format(record("two\nlines %s", "and an arg"))
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["message"] == "two\nlines and an arg"
    assert (fields["level"], fields["logger"], fields["node"]) == (
        "warning",
        "quorumlog.test",
        "n1",
    )
    assert fields["ts"].endswith("+00:00")


def test_an_event_s_fields_become_fields_of_the_line() -> None:
    event = {"kind": "became_leader", "group": "kv", "term": 3, "index": 17}
    fields = json.loads(JsonFormatter("n2").format(record("elected", event=event)))
    assert (fields["kind"], fields["group"], fields["term"], fields["index"]) == (
        "became_leader",
        "kv",
        3,
        17,
    )
    # An event cannot overwrite the line's own fields.
    clash = json.loads(JsonFormatter("n2").format(record("m", event={"node": "x"})))
    assert clash["node"] == "n2"


def test_an_exception_is_kept_in_the_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        made = record("failed")
        made.exc_info = sys.exc_info()
    fields = json.loads(JsonFormatter("n1").format(made))
    assert "ValueError: boom" in fields["exception"]


def test_an_unserialisable_argument_does_not_lose_the_line() -> None:
    fields = json.loads(JsonFormatter("n1").format(record("m", event={"odd": object()})))
    assert fields["odd"].startswith("<object object")


def test_configured_json_logging_writes_events_as_json(restore_root_logger: None) -> None:
    stream = io.StringIO()
    configure_logging("n3", "json", "info", stream=stream)
    EventLog("n3").record("snapshot_taken", group="kv", term=2, index=40, detail="9 bytes")
    logging.getLogger("quorumlog.test").debug("below the level: not written")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    fields = json.loads(lines[0])
    assert (fields["kind"], fields["group"], fields["term"], fields["index"]) == (
        "snapshot_taken",
        "kv",
        2,
        40,
    )


def test_configured_text_logging_names_the_node(restore_root_logger: None) -> None:
    stream = io.StringIO()
    configure_logging("n4", "text", "debug", stream=stream)
    logging.getLogger("quorumlog.test").debug("hello")
    assert " n4 quorumlog.test DEBUG hello" in stream.getvalue()


@pytest.mark.parametrize(("log_format", "level"), [("xml", "info"), ("json", "loud")])
def test_an_unknown_format_or_level_is_refused(log_format: str, level: str) -> None:
    with pytest.raises(ValueError, match="is not one of"):
        configure_logging("n1", log_format, level)
