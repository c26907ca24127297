"""Options of the `quorumlog` and `quorumlog-kv` formats, named as the Kafka source names them.

Spark hands options over case-insensitively (lower-cased), so every name here is matched
without case. Each parse function checks every option it is given and raises `OptionError`
naming the option for a bad value, a missing required one, one that does not apply (such
as `endingOffsets` on a stream), or a name it does not know (with the nearest known name).

Source options (`spark.read` / `spark.readStream`):

| option | value | default |
|---|---|---|
| endpoints | "host:port,host:port,..." | env QUORUMLOG_ENDPOINTS |
| topic, subscribe, subscribePattern, assign | what to read (topic_selection.py) | one |
| startingOffsets | earliest, latest, or {"t":{"0":23,"1":-2}} | batch earliest, stream latest |
| startingTimestamp | ms since the epoch, for every partition | none |
| startingOffsetsByTimestamp | {"t":{"0":1700000000000}} | none |
| startingOffsetsByTimestampStrategy | error / latest: where no record is that new | error |
| endingOffsets | latest or JSON (batch only) | latest |
| endingTimestamp / endingOffsetsByTimestamp | as the starting ones (batch only) | none |
| maxOffsetsPerTrigger | records per micro-batch, over all partitions (stream only) | none |
| minOffsetsPerTrigger | records to wait for before a micro-batch (stream only) | none |
| maxTriggerDelay | how long to wait for them at most: 500ms, 30s, 15m, 1h | 15m |
| failOnDataLoss | true / false | true |
| includeHeaders | true: a `headers` column (Kafka's schema) | false |
| minPartitions | at least this many Spark partitions (batch and stream) | one per topic partition |
| maxRecordsPerPartition | at most this many records per Spark partition | 1000000 |
| fetchRecordsMax / fetchBytesMax | per Fetch request | 10000 / 4 MiB |
| clusterId, timeoutMs | handshake cluster id; per-request deadline | quorumlog, 30000 |
| user, password | with auth on: who reads or writes | env QUORUMLOG_USER, _PASSWORD |

As in Kafka, a time option wins over the offsets one (startingTimestamp, then
startingOffsetsByTimestamp, then startingOffsets; the same for the ending ones), and a
time finds in each partition the earliest offset whose record time is at or after it
(stream/offsets_for_times.py); an ending time where none is found means latest. Times
apply when a stream starts afresh; a restarted stream goes on from its checkpoint.
Kafka client spellings (`kafka.bootstrap.servers`, ...) are read as ours with a warning
(kafka_names.py).

Sink options: endpoints, topic (else a `topic` column), clusterId, timeoutMs, user,
password. KV table options: endpoints, startKey, endKey, pageSize, stale, clusterId,
timeoutMs, user, password.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

import msgspec

from quorumlog.kv.connection import CLUSTER_ID_DEFAULT, parse_endpoints
from quorumlog.spark.errors import OptionError
from quorumlog.spark.kafka_names import kafka_hint, read_kafka_spellings
from quorumlog.spark.offsets import (
    OffsetSpec,
    parse_offset_spec,
    parse_timestamp,
    parse_timestamps_json,
)
from quorumlog.spark.topic_selection import (
    SELECTION_OPTIONS,
    TopicSelection,
    parse_topic_selection,
)
from quorumlog.tls.config import TLSConfig

ENDPOINTS_ENVIRONMENT_VARIABLE = "QUORUMLOG_ENDPOINTS"
TLS_OPTIONS = ("tls.caFile", "tls.certFile", "tls.keyFile")
TIMEOUT_MS_DEFAULT = 30_000
MAX_RECORDS_PER_PARTITION_DEFAULT = 1_000_000
FETCH_RECORDS_MAX_DEFAULT = 10_000
FETCH_BYTES_MAX_DEFAULT = 4 * 1024 * 1024
PAGE_SIZE_DEFAULT = 1_000
MAX_TRIGGER_DELAY_DEFAULT = "15m"
TIMESTAMP_STRATEGIES = ("error", "latest")
DURATION_UNITS_SECONDS = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
"""Units of a duration option, as Spark's `timeStringAsMs` reads them (no unit: ms)."""

# Options Spark itself adds (or users add for Spark) that are not ours to judge.
SPARK_OPTIONS = frozenset({"path", "paths", "checkpointlocation", "queryname"})

CONNECTION_OPTIONS = ("endpoints", "clusterId", "timeoutMs", "user", "password", *TLS_OPTIONS)
USER_ENVIRONMENT_VARIABLE = "QUORUMLOG_USER"
PASSWORD_ENVIRONMENT_VARIABLE = "QUORUMLOG_PASSWORD"
SOURCE_OPTIONS = (
    *CONNECTION_OPTIONS,
    *SELECTION_OPTIONS,
    "startingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "failOnDataLoss",
    "includeHeaders",
    "minPartitions",
    "maxRecordsPerPartition",
    "fetchRecordsMax",
    "fetchBytesMax",
)
BATCH_ONLY_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
STREAM_ONLY_OPTIONS = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
SINK_OPTIONS = (*CONNECTION_OPTIONS, "topic")
TABLE_OPTIONS = (*CONNECTION_OPTIONS, "startKey", "endKey", "pageSize", "stale")


class ConnectionOptions(msgspec.Struct, frozen=True):
    endpoints: list[str]
    cluster_id: str = CLUSTER_ID_DEFAULT
    timeout_seconds: float = TIMEOUT_MS_DEFAULT / 1000
    user: str | None = None
    password: str | None = None
    tls: TLSConfig | None = None
    """From `tls.caFile`, `tls.certFile`, `tls.keyFile` (None: plaintext). The files must
    be readable at the same paths on the driver and every executor."""

    def __repr__(self) -> str:
        # Options reach logs and plans: never print the password.
        return (
            f"ConnectionOptions(endpoints={self.endpoints!r}, cluster_id={self.cluster_id!r}, "
            f"timeout_seconds={self.timeout_seconds!r}, user={self.user!r}, tls={self.tls!r})"
        )


class SourceOptions(msgspec.Struct, frozen=True):
    connection: ConnectionOptions
    selection: TopicSelection
    starting: OffsetSpec
    starting_option: str
    """The option `starting` came from (for error messages)."""
    starting_none_found: str
    """startingOffsetsByTimestampStrategy: "error" or "latest"."""
    ending: OffsetSpec
    ending_option: str
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_seconds: float
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None
    max_records_per_partition: int
    fetch_records_max: int
    fetch_bytes_max: int


class SinkOptions(msgspec.Struct, frozen=True):
    connection: ConnectionOptions
    topic: str | None
    """None: each row names its topic in a `topic` column."""


class TableOptions(msgspec.Struct, frozen=True):
    connection: ConnectionOptions
    start_key: str
    end_key: str | None
    page_size: int
    stale: bool


class Options:
    """The user's options with case-insensitive lookup, checked against the known names."""

    def __init__(self, options: Mapping[str, str], known: tuple[str, ...], what: str) -> None:
        renamed = read_kafka_spellings(options, known)
        self.values = {name: str(value) for name, value in renamed.items()}
        self.names = {name.lower(): name for name in known}
        for given in self.values:
            if given in self.names or given in SPARK_OPTIONS:
                continue
            close = difflib.get_close_matches(given, list(self.names), n=1)
            hint = f"; did you mean {self.names[close[0]]!r}?" if close else ""
            hint += kafka_hint(given, known)
            raise OptionError(
                given, f"not an option of {what}{hint} (known: {', '.join(sorted(known))})"
            )

    def text(self, name: str) -> str | None:
        return self.values.get(name.lower())

    def given(self, name: str) -> bool:
        return name.lower() in self.values

    def integer(self, name: str, default: int | None, minimum: int) -> int | None:
        text = self.text(name)
        if text is None:
            return default
        try:
            value = int(text.strip())
        except ValueError:
            raise OptionError(name, f"{text!r} is not an integer") from None
        if value < minimum:
            raise OptionError(name, f"must be at least {minimum}, got {value}")
        return value

    def required_integer(self, name: str, default: int, minimum: int) -> int:
        value = self.integer(name, default, minimum)
        return default if value is None else value

    def boolean(self, name: str, default: bool) -> bool:
        text = self.text(name)
        if text is None:
            return default
        lowered = text.strip().lower()
        if lowered not in ("true", "false"):
            raise OptionError(name, f"must be true or false, got {text!r}")
        return lowered == "true"

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        """One of `choices` (the first is the default), matched without case."""
        text = self.text(name)
        if text is None:
            return choices[0]
        lowered = text.strip().lower()
        if lowered not in choices:
            raise OptionError(name, f"is one of {', '.join(choices)}, not {text!r}")
        return lowered

    def duration_seconds(self, name: str, default: str) -> float:
        """A duration such as 500ms, 30s, 15m or 1h (a bare number is milliseconds)."""
        text = (self.text(name) or default).strip().lower()
        number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(number) :].strip() or "ms"
        if not number.strip().isdigit() or unit not in DURATION_UNITS_SECONDS:
            raise OptionError(name, f"{text!r} is not a duration like 500ms, 30s, 15m or 1h")
        return int(number) * DURATION_UNITS_SECONDS[unit]


def parse_connection(options: Options) -> ConnectionOptions:
    text = options.text("endpoints")
    if text is None:
        text = os.environ.get(ENDPOINTS_ENVIRONMENT_VARIABLE)
    if text is None or not text.strip():
        raise OptionError(
            "endpoints",
            'required: .option("endpoints", "host:port,host:port,...") '
            f"(or set {ENDPOINTS_ENVIRONMENT_VARIABLE})",
        )
    try:
        endpoints = parse_endpoints(text)
    except ValueError as error:
        raise OptionError("endpoints", str(error)) from None
    cluster_id = options.text("clusterId") or CLUSTER_ID_DEFAULT
    timeout_ms = options.required_integer("timeoutMs", TIMEOUT_MS_DEFAULT, minimum=1)
    user = options.text("user") or os.environ.get(USER_ENVIRONMENT_VARIABLE) or None
    password = options.text("password") or os.environ.get(PASSWORD_ENVIRONMENT_VARIABLE)
    if password is not None and user is None:
        raise OptionError("password", "a password needs a user (option user)")
    return ConnectionOptions(
        endpoints, cluster_id, timeout_ms / 1000, user, password, parse_tls(options)
    )


def parse_tls(options: Options) -> TLSConfig | None:
    """TLS from `tls.caFile`, `tls.certFile` and `tls.keyFile` (None if none is given)."""
    ca_file, cert_file, key_file = (options.text(name) for name in TLS_OPTIONS)
    if ca_file is None and cert_file is None and key_file is None:
        return None
    if (cert_file is None) != (key_file is None):
        missing = "tls.keyFile" if key_file is None else "tls.certFile"
        raise OptionError(missing, "tls.certFile and tls.keyFile go together")
    for name, path in zip(TLS_OPTIONS, (ca_file, cert_file, key_file), strict=True):
        if path is not None and not os.path.isfile(path):
            raise OptionError(name, f"no such file: {path!r}")
    return TLSConfig(ca_file=ca_file, cert_file=cert_file, key_file=key_file)


def parse_source_options(given: Mapping[str, str], streaming: bool) -> SourceOptions:
    what = "spark.readStream.format('quorumlog')" if streaming else "spark.read.format('quorumlog')"
    options = Options(given, SOURCE_OPTIONS, what)
    not_here = BATCH_ONLY_OPTIONS if streaming else STREAM_ONLY_OPTIONS
    for name in not_here:
        if options.given(name):
            kind = "batch" if streaming else "streaming"
            raise OptionError(name, f"applies only to {kind} reads, not to {what}")
    connection = parse_connection(options)
    selection = parse_topic_selection({name: options.text(name) for name in SELECTION_OPTIONS})
    starting_option, starting = parse_starting(options, streaming)
    ending_option, ending = parse_ending(options)
    check_spec_topics(starting, selection, starting_option)
    check_spec_topics(ending, selection, ending_option)
    max_offsets = options.integer("maxOffsetsPerTrigger", None, minimum=1)
    min_offsets = options.integer("minOffsetsPerTrigger", None, minimum=1)
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise OptionError(
            "minOffsetsPerTrigger",
            f"{min_offsets} is more than maxOffsetsPerTrigger {max_offsets}",
        )
    return SourceOptions(
        connection=connection,
        selection=selection,
        starting=starting,
        starting_option=starting_option,
        starting_none_found=options.choice(
            "startingOffsetsByTimestampStrategy", TIMESTAMP_STRATEGIES
        ),
        ending=ending,
        ending_option=ending_option,
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_seconds=options.duration_seconds(
            "maxTriggerDelay", MAX_TRIGGER_DELAY_DEFAULT
        ),
        fail_on_data_loss=options.boolean("failOnDataLoss", True),
        include_headers=options.boolean("includeHeaders", False),
        min_partitions=options.integer("minPartitions", None, minimum=1),
        max_records_per_partition=options.required_integer(
            "maxRecordsPerPartition", MAX_RECORDS_PER_PARTITION_DEFAULT, minimum=1
        ),
        fetch_records_max=options.required_integer(
            "fetchRecordsMax", FETCH_RECORDS_MAX_DEFAULT, minimum=1
        ),
        fetch_bytes_max=options.required_integer(
            "fetchBytesMax", FETCH_BYTES_MAX_DEFAULT, minimum=1024
        ),
    )


def parse_include_headers(given: Mapping[str, str]) -> bool:
    """Only `includeHeaders` (the schema depends on it; the rest is checked at reading)."""
    values = {str(name).lower(): str(value) for name, value in given.items()}
    only = {"includeHeaders": values.get("includeheaders", "false")}
    return Options(only, SOURCE_OPTIONS, "").boolean("includeHeaders", False)


def parse_starting(options: Options, streaming: bool) -> tuple[str, OffsetSpec]:
    """(the option that decides, its spec): the time options win, as in Kafka."""
    timestamp = options.text("startingTimestamp")
    if timestamp is not None:
        return "startingTimestamp", parse_timestamp(timestamp, "startingTimestamp")
    by_timestamp = options.text("startingOffsetsByTimestamp")
    if by_timestamp is not None:
        option = "startingOffsetsByTimestamp"
        return option, parse_timestamps_json(by_timestamp, option)
    text = options.text("startingOffsets") or ("latest" if streaming else "earliest")
    # A batch read cannot start at "latest" (it would read nothing), as in Kafka.
    return "startingOffsets", parse_offset_spec(text, "startingOffsets", allow_latest=streaming)


def parse_ending(options: Options) -> tuple[str, OffsetSpec]:
    timestamp = options.text("endingTimestamp")
    if timestamp is not None:
        return "endingTimestamp", parse_timestamp(timestamp, "endingTimestamp")
    by_timestamp = options.text("endingOffsetsByTimestamp")
    if by_timestamp is not None:
        return "endingOffsetsByTimestamp", parse_timestamps_json(
            by_timestamp, "endingOffsetsByTimestamp"
        )
    text = options.text("endingOffsets") or "latest"
    return "endingOffsets", parse_offset_spec(text, "endingOffsets", allow_earliest=False)


def check_spec_topics(spec: OffsetSpec, selection: TopicSelection, option: str) -> None:
    """JSON offsets may only name topics the read subscribes to (a pattern's topics are
    known only against the cluster: resolving checks them there)."""
    topics = selection.named_topics()
    if topics is None:
        return
    named = {topic for topic, _ in spec.specific}
    others = sorted(named - topics)
    if others:
        raise OptionError(
            option,
            f"names topics that are not read: {', '.join(others)} (reading {sorted(topics)})",
        )


def parse_sink_options(given: Mapping[str, str]) -> SinkOptions:
    options = Options(given, SINK_OPTIONS, "df.write.format('quorumlog')")
    connection = parse_connection(options)
    topic = options.text("topic")
    if topic is not None and (not topic.strip() or "," in topic):
        raise OptionError("topic", f"{topic!r} is not one topic name")
    return SinkOptions(connection, topic.strip() if topic is not None else None)


def parse_table_options(given: Mapping[str, str]) -> TableOptions:
    options = Options(given, TABLE_OPTIONS, "spark.read.format('quorumlog-kv')")
    connection = parse_connection(options)
    start_key = options.text("startKey") or ""
    end_key = options.text("endKey")
    if end_key is not None and end_key <= start_key:
        raise OptionError("endKey", f"{end_key!r} must sort after startKey {start_key!r}")
    return TableOptions(
        connection=connection,
        start_key=start_key,
        end_key=end_key,
        page_size=options.required_integer("pageSize", PAGE_SIZE_DEFAULT, minimum=1),
        stale=options.boolean("stale", False),
    )
