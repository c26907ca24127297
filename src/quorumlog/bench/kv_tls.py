"""`quorumlog bench kv --tls`: throughput with and without TLS, in one run.

The same 3 node processes, load processes, window and offered load as the
`quorumlog-throughput` phase, on two clusters up side by side (an idle one costs next to
nothing: its groups go quiet): one plaintext, one with every connection under TLS —
peers verify each other (`--peer-client-cert-auth`), clients present a certificate
(`--client-cert-auth`), as `quorumlog dev up --tls` sets a cluster up. Rounds alternate
plaintext, TLS, TLS, plaintext (`ROUND_ORDER`): on a shared machine whose other load
drifts during the run, that order gives both sides the same average drift, where one
round each would credit the drift to TLS or against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quorumlog.bench.kv_processes import NodeCluster
from quorumlog.tls.config import TLSConfig
from quorumlog.tls.dev import DevTLS, dev_tls

ROUND_ORDER = ("plaintext", "tls", "tls", "plaintext")
TLS_SHARE_MIN = 0.7
"""What the issue asks TLS to keep of the plaintext puts/s (reported, never enforced)."""


class TLSNodeCluster(NodeCluster):
    """A `NodeCluster` whose nodes require TLS of peers and clients."""

    def __init__(self, directory: Path, node_count: int, cluster_id: str) -> None:
        super().__init__(directory, node_count, cluster_id)
        directory.mkdir(parents=True, exist_ok=True)
        self.certificates: DevTLS = dev_tls(directory)
        files = self.certificates.client_files
        self.tls = TLSConfig(
            ca_file=files["ca_file"], cert_file=files["cert_file"], key_file=files["key_file"]
        )

    def extra_node_arguments(self, node_id: str) -> list[str]:
        return list(self.certificates.node_arguments)

    def load_arguments(self) -> list[str]:
        """The kv_load flags that make a load process talk TLS with the client certificate."""
        files = self.certificates.client_files
        return [
            *("--cacert", files["ca_file"]),
            *("--cert", files["cert_file"], "--key", files["key_file"]),
        ]


def tls_summary(plain_ops_per_s: float, tls_ops_per_s: float) -> dict[str, Any]:
    share = round(tls_ops_per_s / plain_ops_per_s, 3) if plain_ops_per_s else None
    return {
        "tls_ops_per_s": tls_ops_per_s,
        "tls_share_of_plaintext": share,
        "tls_share_min": TLS_SHARE_MIN,
    }


__all__ = ["ROUND_ORDER", "TLS_SHARE_MIN", "TLSNodeCluster", "tls_summary"]
