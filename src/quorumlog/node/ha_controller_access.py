"""`ThreadedControllerAccess`: the broker hosts' `ControllerAccess` over `HAControllerClient`.

The client blocks, so calls run on this object's threads; answers come back on the event
loop. Heartbeats have a client (and a thread) of their own so that a slow register or
AlterSyncStateSet never delays them (a late heartbeat can cost a master its mastership).
A refusal becomes the controller's result (`ok=False` with its code); a failure on the way
(no controller leader in time, a broken connection) is an unknown outcome (None).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from quorumlog.errors import HAControllerRefusedError, QuorumLogError
from quorumlog.ha.broker_host import ControllerCall, ControllerDone
from quorumlog.ha.controller_client import HAControllerClient
from quorumlog.ha.controller_model import (
    AlterSyncStateSet,
    BrokerGroupInfo,
    BrokerHeartbeat,
    HAControllerResult,
    Refusal,
    RegisterBroker,
)
from quorumlog.ledger.client import call_on_loop
from quorumlog.tls.config import TLSConfig


class ThreadedControllerAccess:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        endpoints: list[str],
        cluster_id: str,
        timeout_seconds: float = 2.0,
        tls: TLSConfig | None = None,
    ) -> None:
        self.loop = loop
        self.heartbeats = HAControllerClient(
            endpoints, timeout=timeout_seconds, cluster_id=cluster_id, tls=tls
        )
        self.writes = HAControllerClient(
            endpoints, timeout=timeout_seconds, cluster_id=cluster_id, tls=tls
        )
        self.heartbeat_thread = ThreadPoolExecutor(1, thread_name_prefix="ha-heartbeat")
        self.write_thread = ThreadPoolExecutor(1, thread_name_prefix="ha-controller")

    def submit(self, command: ControllerCall, done: ControllerDone) -> None:
        if isinstance(command, BrokerHeartbeat):
            client = self.heartbeats
            call: Callable[[], BrokerGroupInfo] = lambda: client.heartbeat(  # noqa: E731
                command.group, command.broker_id, command.max_offset, command.epoch
            )
            executor = self.heartbeat_thread
        elif isinstance(command, RegisterBroker):
            writes = self.writes
            call = lambda: writes.register(command.group, command.broker_id, command.address)  # noqa: E731
            executor = self.write_thread
        else:
            call = self.alter_call(command)
            executor = self.write_thread
        try:
            executor.submit(self.run, call, done)
        except RuntimeError:  # shut down: the node is stopping
            self.loop.call_soon(done, None)

    def alter_call(self, command: AlterSyncStateSet) -> Callable[[], BrokerGroupInfo]:
        writes = self.writes
        return lambda: writes.alter_sync_state_set(
            command.group,
            command.master_id,
            command.master_epoch,
            command.sync_state_set_epoch,
            list(command.new_set),
        )

    def run(self, call: Callable[[], BrokerGroupInfo], done: ControllerDone) -> None:
        result: HAControllerResult | None
        try:
            result = HAControllerResult(ok=True, group=call())
        except HAControllerRefusedError as error:
            try:
                refusal = Refusal(error.code)
            except ValueError:
                refusal = Refusal.BAD_REQUEST
            result = HAControllerResult(ok=False, refusal=refusal, error=str(error))
        except (QuorumLogError, OSError):
            result = None
        call_on_loop(self.loop, done, result)

    def close(self) -> None:
        self.heartbeat_thread.shutdown(wait=False, cancel_futures=True)
        self.write_thread.shutdown(wait=False, cancel_futures=True)
        for client in (self.heartbeats, self.writes):
            with contextlib.suppress(QuorumLogError, OSError):
                client.close()


__all__ = ["ThreadedControllerAccess"]
