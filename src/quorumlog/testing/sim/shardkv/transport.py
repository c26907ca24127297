"""Requests over simulated frames: addresses, one attempt at a time, and peer requests.

Everything the sharded KV sends outside Raft (client reads and writes, controller queries
and commands, shard pulls and deletes) travels as `codec.wire` frames on the simulator's
`SimFrameNetwork`, whose endpoints are named by node id (so one set of cut links serves
Raft traffic and frames alike). The shipped code names nodes by address ("host:port": what
`EndpointSelector` takes and NOT_LEADER hints carry); here a node `n` listens at
`n:2379`, and `node_of` maps an address back to the endpoint.

- `FrameCalls`: one process's attempts: each gets a request id, a timer on the process's
  scheduler, and its first answer (a late or duplicated answer is dropped, as a real
  client skips answers to attempts it gave up on). Answers that reach a process restarted
  since the call are dropped too: the call died with the old incarnation.
- `SimPeerRequests`: `node.peer_requests.PeerRequests` for a simulated node: the shipped
  `request_by_attempts` loop and attempt rules, so the migrator runs as on asyncio.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from quorumlog.codec import wire
from quorumlog.node.peer_requests import (
    ATTEMPT_TIMEOUT_SECONDS,
    REQUEST_TIMEOUT_SECONDS,
    Accept,
    AttemptOutcome,
    MakeRequest,
    PeerSelectors,
    request_by_attempts,
)
from quorumlog.runtime.completion import Completion
from quorumlog.testing.sim.frame_network import SimFrameNetwork
from quorumlog.testing.sim.process import SimProcess, SimScheduler

SIM_PORT = 2379


def address_of(node_id: str) -> str:
    """Where simulated node `node_id` listens."""
    return f"{node_id}:{SIM_PORT}"


def node_of(address: str) -> str:
    """The simulated endpoint an address names (a name that is no address names itself)."""
    host, separator, port = address.rpartition(":")
    return host if separator and port == str(SIM_PORT) else address


class FrameCalls:
    """The requests one simulated process sends, one attempt at a time each."""

    def __init__(self, name: str, network: SimFrameNetwork, process: SimProcess) -> None:
        self.name = name
        self.network = network
        self.process = process
        self.scheduler = SimScheduler(process)
        self.next_request_id = 1

    def attempt(
        self,
        address: str,
        make_request: MakeRequest,
        timeout_seconds: float,
        outcome: AttemptOutcome,
    ) -> None:
        """Send one request to `address`; `outcome` gets its first answer, or None once
        `timeout_seconds` pass without one."""
        request_id = self.next_request_id
        self.next_request_id += 1
        incarnation = self.process.incarnation
        finished = False

        def finish(frame: wire.Frame | None) -> None:
            nonlocal finished
            if finished or self.process.incarnation != incarnation:
                return
            finished = True
            timer.cancel()
            outcome(frame)

        def answered(frame: wire.Frame) -> None:
            if getattr(frame, "request_id", None) == request_id:
                finish(frame)

        timer = self.scheduler.call_later(timeout_seconds, lambda: finish(None))
        self.network.call(self.name, node_of(address), make_request(request_id), answered)


class SimPeerRequests:
    """`PeerRequests` over simulated frames: the shipped `request_by_attempts` loop, its
    attempts sent by `FrameCalls`."""

    def __init__(self, calls: FrameCalls, resolve: Callable[[str], str] = str) -> None:
        self.calls = calls
        self.scheduler = calls.scheduler
        self.selectors = PeerSelectors(resolve)

    def request(
        self,
        addresses: Sequence[str],
        make_request: MakeRequest,
        accept: Accept | None = None,
        timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
        attempt_timeout_seconds: float | None = None,
    ) -> Completion[wire.Frame]:
        return request_by_attempts(
            self.scheduler,
            self.selectors,
            self.calls.attempt,
            addresses,
            make_request,
            accept,
            timeout_seconds,
            attempt_timeout_seconds or ATTEMPT_TIMEOUT_SECONDS,
        )


__all__ = ["SIM_PORT", "FrameCalls", "SimPeerRequests", "address_of", "node_of"]
