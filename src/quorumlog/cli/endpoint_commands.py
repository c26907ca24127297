"""`quorumlog endpoint health|status`: etcdctl's names for asking each node how it is.

- `health`: an endpoint is healthy when the node answers, its "kv" group has a leader, and
  a linearizable read through it succeeds (a real read of the key "health", as etcdctl
  reads, within `--timeout`). Exits 1 when any endpoint is unhealthy, after printing all.
- `status`: each node's view (id, leadership, term, log indexes, and last the feature
  level it knows its cluster committed: codec/feature_levels.py), as `quorumlog status`,
  which stays as its alias.

`--cluster` asks every member in the group's member list instead of the endpoints given,
so one reachable endpoint is enough to check the whole cluster (and a member that is down
shows as a row of its own, not as a missing row).
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
import msgspec

from quorumlog.cli.kv_commands import (
    ClientSettings,
    client_options,
    output_option,
    print_table,
    report_status,
)
from quorumlog.errors import QuorumLogError
from quorumlog.kv.client import KVClient

HEALTH_KEY = "health"
"""The key the health check reads (etcdctl reads "health" too); missing is fine."""
HEALTH_COLUMNS = ["endpoint", "health", "took", "error"]


class EndpointHealth(msgspec.Struct, frozen=True):
    endpoint: str
    health: bool
    took_seconds: float
    error: str = ""


def cluster_option(command: Any) -> Any:
    return click.option(
        "--cluster",
        is_flag=True,
        help="Ask every member of the group (from its member list), not only --endpoints.",
    )(command)


def member_endpoints(settings: ClientSettings) -> list[str]:
    """Every member's address, as the group's member list has them (the leader's view)."""
    with settings.client() as client:
        members = client.member_list()
    addresses = [member.address for member in members if member.address]
    unknown = [member.node_id for member in members if not member.address]
    if unknown:
        raise QuorumLogError(f"members {', '.join(unknown)} have no known address")
    return addresses


def resolved(settings: ClientSettings, cluster: bool) -> ClientSettings:
    if not cluster:
        return settings
    return msgspec.structs.replace(settings, endpoints=member_endpoints(settings))


def check_health(settings: ClientSettings, endpoint: str) -> EndpointHealth:
    """Answers, has a leader, serves a linearizable read: each step or the first failure."""
    started = time.monotonic()

    def result(error: str = "") -> EndpointHealth:
        took = round(time.monotonic() - started, 6)
        return EndpointHealth(endpoint, not error, took, error)

    try:
        with KVClient(
            [endpoint], timeout=settings.timeout_seconds, cluster_id=settings.cluster_id
        ) as client:
            status = client.status(endpoint)
            if status.leader is None:
                return result(f"node {status.node_id}: its kv group has no leader")
            client.get(HEALTH_KEY)
    except QuorumLogError as error:
        return result(str(error).splitlines()[0])
    return result()


def health_cells(health: EndpointHealth) -> list[str]:
    return [
        health.endpoint,
        "true" if health.health else "false",
        f"{health.took_seconds * 1000:.1f}ms",
        health.error,
    ]


@click.group("endpoint")
def endpoint_group() -> None:
    """Ask nodes how they are: health and status (etcdctl's `endpoint` commands)."""


@endpoint_group.command("health")
@cluster_option
@output_option
@client_options
def endpoint_health(settings: ClientSettings, write_out: str, cluster: bool) -> None:
    """Whether each endpoint answers, its KV group has a leader and a linearizable read
    through it succeeds. Exits 1 if any is unhealthy."""
    settings = resolved(settings, cluster)
    results = [check_health(settings, endpoint) for endpoint in settings.endpoints]
    if write_out == "json":
        click.echo(json.dumps(msgspec.to_builtins(results), indent=2))
    else:
        print_table(HEALTH_COLUMNS, [health_cells(health) for health in results])
    unhealthy = sum(1 for health in results if not health.health)
    if unhealthy:
        raise QuorumLogError(f"{unhealthy} of {len(results)} endpoints are unhealthy")


@endpoint_group.command("status")
@cluster_option
@output_option
@client_options
def endpoint_status(settings: ClientSettings, write_out: str, cluster: bool) -> None:
    """Each endpoint's view: id, leadership, term, log indexes and the cluster's feature
    level (`quorumlog status` is the same without --cluster). Exits 1 if any endpoint did
    not answer."""
    report_status(resolved(settings, cluster), write_out)


__all__ = ["EndpointHealth", "check_health", "endpoint_group"]
