"""`ShardWatch` on simulated events: a watch of one key, as the shipped client runs it.

The blocking watch (`shard.v3_client.ShardWatch`) loops over long polls; here each poll is
a `RoutedOperation` (the shipped routing rules: WRONG_GROUP and an unreachable group make
it fetch the configuration again and follow the shard), the next poll starts where the
shipped `next_revision_after` says, and a failure is raised as the shipped
`raise_shard_failure` raises it. A poll that no group answered in time is asked again from
the same revision, as the blocking watch does after UnavailableError.
"""

from __future__ import annotations

from quorumlog.codec import wire
from quorumlog.codec.kv_v3 import WatchEvent
from quorumlog.errors import ClientError, UnavailableError
from quorumlog.shard.v3_client import next_revision_after, raise_shard_failure
from quorumlog.testing.sim.shardkv.client import RoutedOperation, SimShardedClient

WATCH_WAIT_MS = 300
"""How long one poll is held at the leader (below the client's attempt timeout)."""


class SimShardWatcher:
    """Watches `key` from `start_revision` of its shard, keeping every event; stops at the
    first error other than an unavailable shard (kept in `error`)."""

    def __init__(self, client: SimShardedClient, key: str, start_revision: int) -> None:
        self.client = client
        self.key = key
        self.next_revision = start_revision
        self.events: list[WatchEvent] = []
        self.error: ClientError | None = None
        self.polls = 0
        self.stopped = False

    def start(self) -> None:
        self.client.driver.calls.process.enter("local", lambda _: self.poll())

    def stop(self) -> None:
        self.stopped = True

    def poll(self) -> None:
        if self.stopped or self.error is not None:
            return
        self.polls += 1
        from_revision = self.next_revision
        RoutedOperation(
            self.client,
            f"watch {self.key!r}",
            self.key,
            lambda request_id, group: wire.WatchPoll(
                request_id=request_id,
                key=self.key,
                from_revision=from_revision,
                wait_ms=WATCH_WAIT_MS,
                group=group,
            ),
            wire.WatchPollResult,
            side_effects=False,
            done=self.answered,
            failed=self.failed,
        ).start()

    def answered(self, answer: wire.WatchPollResult) -> None:
        try:
            if answer.failure is not None:
                raise_shard_failure(answer.failure)
        except ClientError as error:
            self.error = error
            return
        self.events.extend(answer.events)
        self.next_revision = next_revision_after(self.next_revision, answer)
        self.poll()

    def failed(self, error: BaseException) -> None:
        if isinstance(error, UnavailableError):
            self.poll()  # as the blocking watch: ask again from the same revision
            return
        if isinstance(error, ClientError):
            self.error = error
            return
        raise error


__all__ = ["WATCH_WAIT_MS", "SimShardWatcher"]
