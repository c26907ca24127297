"""`quorumlog topic create|list|describe|delete`, `quorumlog produce` and `quorumlog consume`
(kafka-topics and the Kafka console producer and consumer are the models).

Every command takes `--endpoints` (comma-separated host:port; else $QUORUMLOG_ENDPOINTS;
else 127.0.0.1:2379), `--cluster-id` (else $QUORUMLOG_CLUSTER_ID, else "quorumlog") and
`--timeout` seconds. Errors from the cluster reach `main()`, which prints one line and
exits 1.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from quorumlog.cli.credentials import USER_OPTIONS, user_and_password
from quorumlog.cli.defaults import default_endpoints
from quorumlog.cli.tls_options import CLIENT_TLS_OPTIONS, client_tls
from quorumlog.kv.connection import CLUSTER_ID_DEFAULT, parse_endpoints
from quorumlog.stream.poll_interval import MAX_POLL_INTERVAL_MS_DEFAULT
from quorumlog.tls.config import TLSConfig

TIMEOUT_SECONDS_DEFAULT = 10.0
CONSUME_RECORDS_PER_POLL_MAX = 10_000

Command = TypeVar("Command", bound=Callable[..., Any])

if TYPE_CHECKING:  # the clients load only when a command runs, not at CLI start-up
    from quorumlog.stream.records import Record, TopicDescription


class StreamSettings(msgspec.Struct, frozen=True):
    endpoints: list[str]
    cluster_id: str
    timeout_seconds: float
    user: str | None = None
    password: str | None = None
    tls: TLSConfig | None = None


def endpoints_callback(context: click.Context, parameter: click.Parameter, value: str) -> list[str]:
    try:
        return parse_endpoints(value)
    except ValueError as error:
        raise click.BadParameter(str(error), context, parameter) from error


def client_options(command: Command) -> Command:
    """Add --endpoints, --cluster-id and --timeout; the command receives `settings`."""
    options = [
        click.option(
            "--endpoints",
            envvar="QUORUMLOG_ENDPOINTS",
            default=default_endpoints,
            show_default="the dev cluster started here, else 127.0.0.1:2379",
            callback=endpoints_callback,
            help="Comma-separated HOST:PORT of any nodes (else $QUORUMLOG_ENDPOINTS).",
        ),
        click.option("--cluster-id", envvar="QUORUMLOG_CLUSTER_ID", default=CLUSTER_ID_DEFAULT),
        click.option(
            "--timeout",
            "timeout_seconds",
            type=click.FloatRange(min=0, min_open=True),
            default=TIMEOUT_SECONDS_DEFAULT,
            show_default=True,
            help="Seconds to keep trying one request.",
        ),
        *USER_OPTIONS,
        *CLIENT_TLS_OPTIONS,
    ]

    def wrapped(
        endpoints: list[str],
        cluster_id: str,
        timeout_seconds: float,
        tls_cacert: str | None,
        tls_cert: str | None,
        tls_key: str | None,
        skip_hostname_check: bool,
        **arguments: Any,
    ) -> Any:
        user, password = user_and_password(arguments)
        tls = client_tls(tls_cacert, tls_cert, tls_key, skip_hostname_check)
        settings = StreamSettings(endpoints, cluster_id, timeout_seconds, user, password, tls)
        return command(settings=settings, **arguments)

    wrapped.__name__ = command.__name__
    wrapped.__doc__ = command.__doc__
    decorated: Any = wrapped
    for option in reversed(options):
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]


# --- topic ---------------------------------------------------------------------------------


@click.group("topic")
def topic_group() -> None:
    """Create, list, describe and delete topics."""


@topic_group.command("create")
@click.argument("name")
@click.option("--partitions", type=click.IntRange(1), default=1, show_default=True)
@click.option("--replication", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--retention-bytes", type=click.IntRange(-1), default=-1, help="Per partition; -1: none."
)
@click.option("--retention-ms", type=click.IntRange(-1), default=-1, help="-1: none.")
@click.option(
    "--storage",
    type=click.Choice(["raft", "ledger", "ha"]),
    default="raft",
    show_default=True,
    help=(
        "raft: a Raft group per partition; ledger: ledgers on bookies, one owner node; "
        "ha: a broker group per partition, master elected by the HA controller."
    ),
)
@click.option("--ensemble", type=click.IntRange(1), default=3, show_default=True)
@click.option("--write-quorum", type=click.IntRange(1), default=2, show_default=True)
@click.option("--ack-quorum", type=click.IntRange(1), default=2, show_default=True)
@client_options
def topic_create(
    settings: StreamSettings,
    name: str,
    partitions: int,
    replication: int,
    retention_bytes: int,
    retention_ms: int,
    storage: str,
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
) -> None:
    """Create topic NAME. With --storage ledger, --ensemble, --write-quorum and
    --ack-quorum size its ledgers and --replication counts the nodes that may own each
    partition."""
    from quorumlog.stream.client_admin import Admin

    with admin_for(settings, Admin) as admin:
        admin.create_topic(
            name,
            partitions,
            replication,
            retention_bytes,
            retention_ms,
            storage=storage,
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
        )
    click.echo(f"Created topic {name}.")


@topic_group.command("list")
@client_options
def topic_list(settings: StreamSettings) -> None:
    """Print every topic's name, one a line."""
    from quorumlog.stream.client_admin import Admin

    with admin_for(settings, Admin) as admin:
        for name in admin.list_topics():
            click.echo(name)


@topic_group.command("describe")
@click.argument("names", nargs=-1)
@client_options
def topic_describe(settings: StreamSettings, names: tuple[str, ...]) -> None:
    """Describe topics NAMES (default: all): per partition its leader, replicas, in-sync
    replicas and begin and end offsets."""
    from quorumlog.stream.client_admin import Admin

    with admin_for(settings, Admin) as admin:
        for name in names or admin.list_topics():
            for line in describe_lines(admin.describe_topic(name)):
                click.echo(line)


def describe_lines(description: TopicDescription) -> Iterator[str]:
    yield (
        f"Topic: {description.name}\tPartitionCount: {description.partition_count}\t"
        f"ReplicationFactor: {description.replication}\t"
        f"RetentionBytes: {description.retention_bytes}\tRetentionMs: {description.retention_ms}"
        f"\tStorage: {description.storage}"
        + (
            f"\tEnsemble: {description.ensemble}\tWriteQuorum: {description.write_quorum}\t"
            f"AckQuorum: {description.ack_quorum}"
            if description.storage == "ledger"
            else ""
        )
    )
    for partition in description.partitions:
        line = (
            f"\tTopic: {description.name}\tPartition: {partition.partition}\t"
            f"Leader: {partition.leader or 'none'}\tReplicas: {','.join(partition.replicas)}\t"
            f"Isr: {','.join(partition.in_sync)}\t"
            f"BeginOffset: {unknown_if_none(partition.begin_offset)}\t"
            f"EndOffset: {unknown_if_none(partition.end_offset)}"
        )
        if partition.error is not None:
            line += f"\tError: {partition.error}"
        yield line


def unknown_if_none(value: int | None) -> str:
    return "unknown" if value is None else str(value)


@topic_group.command("delete")
@click.argument("name")
@client_options
def topic_delete(settings: StreamSettings, name: str) -> None:
    """Delete topic NAME and its records."""
    from quorumlog.stream.client_admin import Admin

    with admin_for(settings, Admin) as admin:
        admin.delete_topic(name)
    click.echo(f"Deleted topic {name}.")


AdminType = TypeVar("AdminType")


def admin_for(settings: StreamSettings, admin_type: Callable[..., AdminType]) -> AdminType:
    return admin_type(
        settings.endpoints,
        timeout=settings.timeout_seconds,
        cluster_id=settings.cluster_id,
        user=settings.user,
        password=settings.password,
        tls=settings.tls,
    )


# --- produce -------------------------------------------------------------------------------


@click.command("produce")
@click.argument("topic")
@click.option(
    "--key-separator",
    default=None,
    help="Each line is KEY<separator>VALUE (split at the first separator).",
)
@click.option("--partition", type=click.IntRange(0), default=None, help="Write to this one.")
@click.option("--linger-ms", type=click.FloatRange(0), default=5.0, show_default=True)
@client_options
def produce_command(
    settings: StreamSettings,
    topic: str,
    key_separator: str | None,
    partition: int | None,
    linger_ms: float,
) -> None:
    """Write each line of stdin to TOPIC as one record (the value; with --key-separator,
    a key and a value). Exits once every record is committed; 1 if any failed."""
    from quorumlog.stream.producer import Producer

    stdin = sys.stdin.buffer
    separator = key_separator.encode() if key_separator else None
    with Producer(
        settings.endpoints,
        linger_ms=linger_ms,
        timeout=settings.timeout_seconds,
        cluster_id=settings.cluster_id,
        user=settings.user,
        password=settings.password,
        tls=settings.tls,
    ) as producer:
        futures = []
        for line_number, (key, value) in enumerate(split_lines(stdin, separator), start=1):
            futures.append((line_number, producer.send(topic, value, key, partition)))
        producer.flush()
    failed = [(number, future.exception()) for number, future in futures if future.exception()]
    for number, error in failed[:5]:
        click.echo(f"error: line {number}: {error}", err=True)
    if failed:
        click.echo(f"error: {len(failed)} of {len(futures)} records failed", err=True)
        sys.exit(1)


def split_lines(stream: IO[bytes], separator: bytes | None) -> Iterator[tuple[bytes | None, bytes]]:
    for line_number, line in enumerate(stream, start=1):
        line = line.rstrip(b"\r\n")
        if separator is None:
            yield None, line
            continue
        key, found, value = line.partition(separator)
        if not found:
            raise click.ClickException(
                f"line {line_number} has no key separator {separator.decode()!r}"
            )
        yield key, value


# --- consume -------------------------------------------------------------------------------


@click.command("consume")
@click.argument("topic")
@click.option(
    "--from-beginning", is_flag=True, help="Start at the first retained offset, not the end."
)
@click.option("--max-messages", type=click.IntRange(1), default=None, help="Stop after N.")
@click.option("--partition", type=click.IntRange(0), default=None, help="Read this one only.")
@click.option(
    "--offset",
    default=None,
    help="earliest, latest, or an offset to start at (a number needs --partition).",
)
@click.option(
    "--group",
    default=None,
    help="Join this consumer group (share the partitions with its other members) and "
    "commit its offsets; with --partition, read that partition and commit outside "
    "membership (refused while the group has members).",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(0),
    default=None,
    help="Exit after this long with nothing new (default: wait forever).",
)
@click.option("--print-key", is_flag=True)
@click.option("--print-offset", is_flag=True)
@click.option("--print-partition", is_flag=True)
@click.option("--print-timestamp", is_flag=True, help="Milliseconds since the Unix epoch.")
@click.option("--separator", default="\t", show_default=r"\t", help="Between printed fields.")
@click.option(
    "--max-poll-interval-ms",
    type=click.IntRange(1, 2**31 - 1),
    default=MAX_POLL_INTERVAL_MS_DEFAULT,
    show_default=True,
    help="With --group: leave the group if printing stalls this long (Kafka's "
    "max.poll.interval.ms); the next poll joins again.",
)
@client_options
def consume_command(
    settings: StreamSettings,
    topic: str,
    from_beginning: bool,
    max_messages: int | None,
    partition: int | None,
    offset: str | None,
    group: str | None,
    timeout_ms: int | None,
    print_key: bool,
    print_offset: bool,
    print_partition: bool,
    print_timestamp: bool,
    separator: str,
    max_poll_interval_ms: int,
) -> None:
    """Print TOPIC's records, one a line (values as UTF-8, undecodable bytes escaped)."""
    from quorumlog.stream.consumer import Consumer

    start = parse_start_offset(offset, partition)
    fields = PrintedFields(print_timestamp, print_partition, print_offset, print_key, separator)
    earliest = from_beginning or start == "earliest"
    with Consumer(
        settings.endpoints,
        group=group,
        auto_offset_reset="earliest" if earliest else "latest",
        timeout=settings.timeout_seconds,
        cluster_id=settings.cluster_id,
        user=settings.user,
        password=settings.password,
        tls=settings.tls,
        enable_auto_commit=False,
        max_poll_interval_ms=max_poll_interval_ms,
    ) as consumer:
        if group is not None and partition is None:
            consumer.subscribe([topic])
        else:
            chosen = consumer.partitions(topic) if partition is None else [partition]
            consumer.assign([(topic, number) for number in chosen])
            if partition is not None and isinstance(start, int):
                consumer.seek(topic, partition, start)
        printed = 0
        while max_messages is None or printed < max_messages:
            wanted = CONSUME_RECORDS_PER_POLL_MAX
            if max_messages is not None:
                wanted = min(wanted, max_messages - printed)
            wait_seconds = 3600.0 if timeout_ms is None else timeout_ms / 1000
            records = consumer.poll(wait_seconds, max_records=wanted)
            if not records and timeout_ms is not None:
                break
            for record in records:
                click.echo(fields.format(record))
            printed += len(records)
            if group is not None and records:
                consumer.commit()


def parse_start_offset(offset: str | None, partition: int | None) -> str | int | None:
    """--offset: "earliest", "latest" or a number (which needs --partition)."""
    if offset is None or offset in ("earliest", "latest"):
        return offset
    if not offset.isdigit():
        raise click.BadParameter(
            f"{offset!r} is not earliest, latest or an offset", param_hint="--offset"
        )
    if partition is None:
        raise click.UsageError("--offset N needs --partition")
    return int(offset)


class PrintedFields(msgspec.Struct, frozen=True):
    timestamp: bool
    partition: bool
    offset: bool
    key: bool
    separator: str

    def format(self, record: Record) -> str:
        parts = []
        if self.timestamp:
            parts.append(f"Timestamp:{record.timestamp}")
        if self.partition:
            parts.append(f"Partition:{record.partition}")
        if self.offset:
            parts.append(f"Offset:{record.offset}")
        if self.key:
            parts.append(text_of(record.key))
        parts.append(text_of(record.value))
        return self.separator.join(parts)


def text_of(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="backslashreplace")


__all__ = ["consume_command", "produce_command", "topic_group"]
