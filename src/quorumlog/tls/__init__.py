"""TLS for quorumlog: the settings clients and nodes take, the `ssl` contexts built from
them, and a maker of throwaway certificates (`quorumlog dev up --tls`, tests).

- `config`: `TLSConfig` (what a client gives: `tls=TLSConfig(ca_file=...)`) and
  `NodeTLS` (a node's etcd-style flags), and the contexts each side uses;
- `handshake`: opening a TLS connection (blocking or asyncio) with handshake failures
  raised as `TLSHandshakeError`, and the checks a node makes of a peer's certificate;
- `certificates`: a CA and certificates signed by it, written as PEM files.
"""

from __future__ import annotations

from quorumlog.tls.config import NodeTLS, TLSConfig

__all__ = ["NodeTLS", "TLSConfig"]
