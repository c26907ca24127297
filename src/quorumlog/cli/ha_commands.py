"""`quorumlog ha groups|sync-state-set|elect-master`: controller mode's broker groups, as
RocketMQ's mqadmin shows them (getSyncStateSet, electMaster).

The endpoints are any nodes of the cluster (`--endpoints`, as for the KV commands): every
node hosts the HA controller group and points the client at its leader. `ha epochs` asks
the broker's own node for its epoch file.
"""

from __future__ import annotations

import json

import click
import msgspec

from quorumlog.cli.kv_commands import ClientSettings, client_options, output_option, print_table
from quorumlog.ha.controller_client import HAControllerClient
from quorumlog.ha.controller_model import BrokerGroupInfo


def controller_client(settings: ClientSettings) -> HAControllerClient:
    return HAControllerClient(
        settings.endpoints,
        timeout=settings.timeout_seconds,
        cluster_id=settings.cluster_id,
        tls=settings.tls,
    )


def members_cell(info: BrokerGroupInfo) -> str:
    """Each broker with its max offset; "*" marks the dead."""
    return ", ".join(
        f"{broker.broker_id}@{broker.max_offset}{'' if broker.alive else '*'}"
        for broker in info.brokers
    )


GROUP_COLUMNS = ["group", "master", "epoch", "sync state set", "sss epoch", "members"]


def group_cells(info: BrokerGroupInfo) -> list[str]:
    return [
        info.group,
        info.master_id or "-",
        str(info.master_epoch),
        ",".join(info.sync_state_set),
        str(info.sync_state_set_epoch),
        members_cell(info),
    ]


def print_groups(infos: list[BrokerGroupInfo], write_out: str) -> None:
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(infos), indent=2))
    else:
        print_table(GROUP_COLUMNS, [group_cells(info) for info in infos])


@click.group("ha")
def ha_group() -> None:
    """Controller mode: broker groups, their masters and SyncStateSets."""


@ha_group.command("groups")
@output_option
@client_options
def ha_groups(settings: ClientSettings, write_out: str) -> None:
    """Every broker group: master, MasterEpoch, SyncStateSet, members with max offsets
    ("*": not heard from within the heartbeat timeout)."""
    with controller_client(settings) as client:
        infos = client.list_groups()
    print_groups(infos, write_out)


@ha_group.command("sync-state-set")
@click.argument("group")
@output_option
@client_options
def ha_sync_state_set(settings: ClientSettings, group: str, write_out: str) -> None:
    """One broker group's SyncStateSet and its members."""
    with controller_client(settings) as client:
        info = client.get_group(group)
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(info), indent=2))
        return
    in_sync = set(info.sync_state_set)
    rows = [
        [
            broker.broker_id,
            broker.address,
            "master" if broker.broker_id == info.master_id else "slave",
            "yes" if broker.broker_id in in_sync else "no",
            "yes" if broker.alive else "no",
            str(broker.max_offset),
            str(broker.epoch),
        ]
        for broker in info.brokers
    ]
    click.echo(
        f"{info.group}: master {info.master_id or '-'} at MasterEpoch {info.master_epoch}, "
        f"SyncStateSet epoch {info.sync_state_set_epoch}"
    )
    print_table(["broker", "address", "role", "in sync", "alive", "max offset", "epoch"], rows)


@ha_group.command("elect-master")
@click.argument("group")
@click.option("--broker", "broker_id", default=None, help="The broker to make master.")
@output_option
@client_options
def ha_elect_master(
    settings: ClientSettings, group: str, broker_id: str | None, write_out: str
) -> None:
    """Elect a new master: BROKER (an alive SyncStateSet member), or the controller's
    choice when the master is gone."""
    with controller_client(settings) as client:
        info = client.elect_master(group, broker_id)
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(info), indent=2))
    else:
        click.echo(f"{info.group}: master {info.master_id} at MasterEpoch {info.master_epoch}")


COMMANDS = [ha_group]


@ha_group.command("epochs")
@click.argument("group")
@click.option("--broker", "broker_id", required=True, help="The broker (its node id).")
@output_option
@client_options
def ha_epochs(settings: ClientSettings, group: str, broker_id: str, write_out: str) -> None:
    """A broker's epoch file: <MasterEpoch, start offset> of each master it has data of,
    with the range each covers of its commit log."""
    with controller_client(settings) as client:
        status = client.broker_status(group, broker_id)
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(status), indent=2))
        return
    click.echo(
        f"{status.group}/{status.broker_id}: {status.role} at MasterEpoch "
        f"{status.master_epoch}, max offset {status.max_offset}, "
        f"confirm offset {status.confirm_offset}"
    )
    entries = status.epochs
    rows = [
        [
            str(entry.epoch),
            str(entry.start_offset),
            str(
                entries[number + 1].start_offset if number + 1 < len(entries) else status.max_offset
            ),
        ]
        for number, entry in enumerate(entries)
    ]
    print_table(["epoch", "start offset", "end offset"], rows)
