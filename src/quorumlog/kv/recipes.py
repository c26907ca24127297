"""A lock and a leader election built from leases and transactions (the README's recipes).

    with Lock(client, "locks/report", ttl_seconds=10):
        ...  # only one holder at a time, cluster-wide

The holder's key is put under a lease in a txn that succeeds only if the key does not
exist (`create == 0`); a thread keeps the lease alive. If the holder dies, its lease runs
out and the key vanishes, so the lock frees itself within one TTL (plus the leader's
extension after a leader change). Waiters watch the key and try again when it is deleted.
An election is a lock whose value names the leader.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from types import TracebackType

from quorumlog.errors import ClientError, LeaseNotFoundError
from quorumlog.kv.client import KVClient

WATCH_POLL_SECONDS_MAX = 1.0


class Lock:
    def __init__(
        self, client: KVClient, name: str, ttl_seconds: int = 10, value: str | None = None
    ) -> None:
        self.client = client
        self.name = name
        self.ttl_seconds = ttl_seconds
        self.value = value or uuid.uuid4().hex
        """What the key holds while this holder has it (its identity)."""
        self.lease = 0
        self.held = False
        self.keeper_stop = threading.Event()
        """Set to stop keeping the lease alive (as a holder that died would)."""
        self.keeper: threading.Thread | None = None

    def acquire(self, timeout_seconds: float | None = None) -> bool:
        """Take the lock, waiting up to `timeout_seconds` (None: as long as it takes)."""
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        self.lease = self.client.lease_grant(self.ttl_seconds)
        self.keeper_stop.clear()
        self.keeper = threading.Thread(target=self.keep_alive, daemon=True)
        self.keeper.start()
        while True:
            result = self.client.txn(
                [("create", self.name, "==", 0)],
                [("put", self.name, self.value, self.lease)],
                [("get", self.name)],
            )
            if result.succeeded:
                self.held = True
                return True
            if not self.wait_for_delete(result.revision, deadline):
                self.give_up()
                return False

    def wait_for_delete(self, revision: int, deadline: float | None) -> bool:
        """Wait until the key changes after `revision`; False at the deadline."""
        with self.client.watch(self.name, start_revision=revision + 1) as watch:
            while True:
                wait_seconds = WATCH_POLL_SECONDS_MAX
                if deadline is not None:
                    wait_seconds = min(wait_seconds, deadline - time.monotonic())
                    if wait_seconds <= 0:
                        return False
                if any(event.type == "DELETE" for event in watch.poll(wait_seconds)):
                    return True

    def keep_alive(self) -> None:
        period_seconds = max(self.ttl_seconds / 3, 0.2)
        while not self.keeper_stop.wait(period_seconds):
            try:
                self.client.lease_keepalive(self.lease)
            except LeaseNotFoundError:
                self.held = False  # it ran out: the lock is lost
                return
            except ClientError:
                continue  # the cluster is busy or electing: try again next period

    def give_up(self) -> None:
        self.keeper_stop.set()
        with contextlib.suppress(LeaseNotFoundError):
            self.client.lease_revoke(self.lease)
        self.held = False

    def release(self) -> None:
        """Free the lock (only if still ours: the key holds our value)."""
        self.client.txn([("value", self.name, "==", self.value)], [("delete", self.name)])
        self.give_up()

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


class Election(Lock):
    """Leader election: the candidate whose lock holds is the leader."""

    def __init__(self, client: KVClient, name: str, candidate: str, ttl_seconds: int = 10) -> None:
        super().__init__(client, name, ttl_seconds, value=candidate)

    def campaign(self, timeout_seconds: float | None = None) -> bool:
        return self.acquire(timeout_seconds)

    def leader(self) -> str | None:
        kvs = self.client.range(self.name).kvs
        return kvs[0].value.decode() if kvs else None

    def resign(self) -> None:
        self.release()


__all__ = ["Election", "Lock"]
