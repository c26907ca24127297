"""`quorumlog group list|describe|reset-offsets|delete` (Kafka's kafka-consumer-groups is
the model). Each takes the stream commands' `--endpoints`, `--cluster-id` and `--timeout`;
list and describe also `-w table|json`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import msgspec

from quorumlog.cli.kv_commands import output_option
from quorumlog.cli.stream_commands import StreamSettings, admin_for, client_options

if TYPE_CHECKING:
    from quorumlog.stream.group_admin import GroupDescription


@click.group("group")
def group_group() -> None:
    """Consumer groups: list, describe (offsets and lag), reset offsets, delete."""


@group_group.command("list")
@output_option
@client_options
def group_list(settings: StreamSettings, write_out: str) -> None:
    """Print every consumer group with its state and member count."""
    from quorumlog.stream.group_admin import GroupAdmin

    with admin_for(settings, GroupAdmin) as admin:
        groups = admin.list_groups()
    if write_out == "json":
        click.echo(msgspec.json.encode(groups).decode())
        return
    click.echo(
        table(
            [["GROUP", "STATE", "MEMBERS", "GENERATION"]]
            + [[g.group, g.state, str(g.members), str(g.generation)] for g in groups]
        )
    )


@group_group.command("describe")
@click.argument("group")
@output_option
@client_options
def group_describe(settings: StreamSettings, group: str, write_out: str) -> None:
    """Describe GROUP: per partition the committed offset, the end offset, the lag and the
    member reading it; then the members."""
    from quorumlog.stream.group_admin import GroupAdmin

    with admin_for(settings, GroupAdmin) as admin:
        description = admin.describe_group(group)
    if write_out == "json":
        click.echo(msgspec.json.encode(description).decode())
        return
    click.echo(describe_table(description))


def describe_table(description: GroupDescription) -> str:
    rows = [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER"]]
    for row in description.partitions:
        rows.append(
            [
                description.group,
                row.topic,
                str(row.partition),
                dash(row.committed_offset),
                dash(row.end_offset),
                dash(row.lag),
                row.member_id or "-",
            ]
        )
    lines = [
        f"Group {description.group} is {description.state} (generation "
        f"{description.generation}, assignor {description.assignor or '-'}, "
        f"{len(description.members)} members)",
        table(rows),
    ]
    for member in description.members:
        assigned = ",".join(f"{topic}/{partition}" for topic, partition in member.assignment)
        lines.append(f"member {member.member_id} (client {member.client_id}): {assigned or '-'}")
    return "\n".join(lines)


@group_group.command("reset-offsets")
@click.argument("group")
@click.option("--topic", required=True, help="The topic whose partitions to reset.")
@click.option("--to-earliest", is_flag=True, help="To the first retained offset.")
@click.option("--to-latest", is_flag=True, help="To the end (skip everything there is).")
@click.option("--to-offset", type=click.IntRange(min=0), help="To this offset (clamped).")
@client_options
def group_reset_offsets(
    settings: StreamSettings,
    group: str,
    topic: str,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
) -> None:
    """Set GROUP's offsets of every partition of --topic. Refused while the group has
    live members (stop its consumers first)."""
    from quorumlog.stream.group_admin import GroupAdmin

    chosen = [flag for flag in (to_earliest, to_latest, to_offset is not None) if flag]
    if len(chosen) != 1:
        raise click.UsageError("give one of --to-earliest, --to-latest, --to-offset N")
    target: str | int = "earliest" if to_earliest else "latest" if to_latest else to_offset or 0
    with admin_for(settings, GroupAdmin) as admin:
        offsets = admin.reset_offsets(group, topic, target)
    for partition, offset in sorted(offsets.items()):
        click.echo(f"{group}\t{topic}\t{partition}\t{offset}")


@group_group.command("delete")
@click.argument("group")
@client_options
def group_delete(settings: StreamSettings, group: str) -> None:
    """Delete GROUP and its offsets. Refused while the group has live members."""
    from quorumlog.stream.group_admin import GroupAdmin

    with admin_for(settings, GroupAdmin) as admin:
        admin.delete_group(group)
    click.echo(f"deleted group {group}")


def dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


__all__ = ["group_group"]
