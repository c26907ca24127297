"""One KV client to the metadata group, kept by a bookie's background workers (its
registrar, its garbage collector) on their own thread and made again when the group's
endpoints change (they are learned, so they move)."""

from __future__ import annotations

from quorumlog.auth.credentials import CredentialsSource
from quorumlog.errors import ClientError
from quorumlog.kv.client import KVClient
from quorumlog.tls.config import TLSConfig


class KeptMetadataClient:
    """Used from one thread only (the worker's)."""

    def __init__(
        self,
        cluster_id: str,
        timeout_seconds: float,
        credentials: CredentialsSource | None,
        tls: TLSConfig | None,
    ) -> None:
        self.cluster_id = cluster_id
        self.timeout_seconds = timeout_seconds
        self.credentials = credentials
        self.tls = tls
        self.client: KVClient | None = None
        self.endpoints: list[str] = []

    def client_for(self, endpoints: list[str]) -> KVClient:
        """The kept client if it was made for `endpoints`, else a new one for them."""
        if self.client is None or endpoints != self.endpoints:
            self.close()
            self.client = self.new_client(endpoints, self.timeout_seconds)
            self.endpoints = list(endpoints)
        return self.client

    def new_client(self, endpoints: list[str], timeout_seconds: float) -> KVClient:
        try:
            return KVClient(
                endpoints,
                timeout=timeout_seconds,
                cluster_id=self.cluster_id,
                credentials=self.credentials,
                tls=self.tls,
            )
        except ValueError as error:
            # Endpoints are data here (learned, or typed by an operator): a failed call.
            raise ClientError(f"no usable metadata endpoints {endpoints}: {error}") from error

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


__all__ = ["KeptMetadataClient"]
