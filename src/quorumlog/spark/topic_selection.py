"""Which topic partitions a read takes, as the Kafka source names the choice.

Exactly one of:

| option | value | partitions read |
|---|---|---|
| topic | one topic name | all of that topic's |
| subscribe | "a,b,c" | all of each topic's |
| subscribePattern | a regular expression, matched against whole names | every matching topic's |
| assign | JSON {"a": [0, 2], "b": [1]} | exactly those |

A pattern is matched as Java's `matches` does (the whole name). A stream looks it up again
at each micro-batch, so topics created later join it, read from their first offset, as
Kafka's source reads them. Parsing here is offline; `ClusterAccess.selected_partitions`
looks the choice up.
"""

from __future__ import annotations

import json
import re

import msgspec

from quorumlog.spark.errors import OptionError
from quorumlog.spark.offsets import TopicPartition

SELECTION_OPTIONS = ("topic", "subscribe", "subscribePattern", "assign")


class TopicSelection(msgspec.Struct, frozen=True):
    option: str
    """The option that chose ("topic", "subscribe", "subscribePattern" or "assign"): error
    messages name it."""
    topics: list[str] = []
    """The topics named (by topic, subscribe or assign), in the order given."""
    pattern: str | None = None
    assigned: list[TopicPartition] = []
    """For assign: exactly the partitions to read, sorted."""

    def named_topics(self) -> set[str] | None:
        """Every topic this selection can read, or None when a pattern decides it later."""
        return None if self.pattern is not None else set(self.topics)

    def matches(self, topic: str) -> bool:
        return self.pattern is not None and re.fullmatch(self.pattern, topic) is not None


def parse_topic_selection(texts: dict[str, str | None]) -> TopicSelection:
    """`texts`: each of SELECTION_OPTIONS to its value (None if not given)."""
    given = [name for name in SELECTION_OPTIONS if texts.get(name) is not None]
    if not given:
        raise OptionError(
            "topic",
            'required: one of .option("topic", "name"), "subscribe" (a,b), "subscribePattern" '
            '(a regular expression) or "assign" ({"topic": [0, 1]})',
        )
    if len(given) > 1:
        raise OptionError(given[1], f"give only one of {', '.join(given)}")
    option = given[0]
    text = texts[option] or ""
    if option == "topic":
        if not text.strip() or "," in text:
            raise OptionError("topic", f"{text!r} is not one topic name (use 'subscribe')")
        return TopicSelection(option, topics=[text.strip()])
    if option == "subscribe":
        return TopicSelection(option, topics=parse_subscribe(text))
    if option == "subscribePattern":
        return TopicSelection(option, pattern=parse_pattern(text))
    assigned = parse_assign(text)
    topics = list(dict.fromkeys(topic for topic, _ in assigned))
    return TopicSelection(option, topics=topics, assigned=assigned)


def parse_subscribe(text: str) -> list[str]:
    topics = [name.strip() for name in text.split(",") if name.strip()]
    if not topics:
        raise OptionError("subscribe", "names no topic")
    if len(set(topics)) != len(topics):
        raise OptionError("subscribe", f"names a topic twice: {text!r}")
    return topics


def parse_pattern(text: str) -> str:
    if not text.strip():
        raise OptionError("subscribePattern", "is empty")
    try:
        re.compile(text)
    except re.error as error:
        raise OptionError(
            "subscribePattern", f"{text!r} is not a regular expression ({error})"
        ) from None
    return text


def parse_assign(text: str) -> list[TopicPartition]:
    expected = 'expected JSON like {"topicA": [0, 1], "topicB": [2]}'
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError("assign", f"not valid JSON ({error.msg}); {expected}") from None
    if not isinstance(document, dict) or not document:
        raise OptionError("assign", f"{text!r}: {expected}")
    assigned: set[TopicPartition] = set()
    for topic, partitions in document.items():
        if not topic or not isinstance(partitions, list) or not partitions:
            raise OptionError("assign", f"topic {topic!r} needs a non-empty list of partitions")
        for partition in partitions:
            if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
                raise OptionError(
                    "assign", f"topic {topic!r}: {partition!r} is not a partition number"
                )
            if (topic, partition) in assigned:
                raise OptionError("assign", f"names {topic}/{partition} twice")
            assigned.add((topic, partition))
    return sorted(assigned)
