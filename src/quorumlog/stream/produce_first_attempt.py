"""A produce's first attempt, made straight at the partition's known leader.

A producer spread over a thousand partitions sends a batch of a few dozen records per
partition and round trip, so what a batch costs besides its records decides its speed.
The general request path (`StreamTransport.partition_call`: the topic's descriptor, the
replicas' addresses, a selector, a `RequestAttempts`, the retry loop, a connection looked
up through a shielded task) cost the producer's I/O thread more per batch than settling
the batch's records did. Almost every batch goes to a leader the producer already knows
over a connection already open, and is answered: that attempt is made here, with none of
that. It is the attempt the retry loop would have made first (`EndpointSelector.choose`
gives the known leader; its deadline and patience are the same), so when it is not simply
answered, its `RequestAttempts` is made after the fact, told what happened as the retry
loop would have told it (sent; then answered, or lost), and handed to the retry loop
(`StreamTransport.call_with`) to go on with: refusals, NOT_LEADER hints, back-offs, a
NOT_FOUND check and the final error (unknown outcome once anything was sent) are the
retry loop's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from quorumlog.codec.wire import ClientRequest, ErrorCode, ErrorResponse, ProduceResult
from quorumlog.kv.async_client import ATTEMPT_ERRORS
from quorumlog.kv.connection import EndpointSelector
from quorumlog.stream.client_common import StreamTransport, TrackedAttempts


async def produce_at_known_leader(
    transport: StreamTransport,
    topic: str,
    partition: int,
    what: Callable[[], str],
    make_request: Callable[[int], ClientRequest],
    timeout_seconds: float,
    attempt_timeout_seconds: float,
) -> ProduceResult | TrackedAttempts | None:
    """The answer of one attempt at the partition's known leader on its open connection;
    else the attempts to go on with (`call_with`), or None if no such attempt could be
    made (no leader known, no open connection: nothing was sent). `what` names the request
    (made only if needed: it is formatted text). See the module docstring."""
    cached = transport.selectors.get((topic, partition))
    if cached is None:
        return None
    selector = cached[1]
    endpoint = selector.leader
    if endpoint is None:
        return None
    kv = transport.kv
    connection = kv.open_connection(endpoint)
    if connection is None:
        return None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    attempt_deadline = min(deadline, loop.time() + attempt_timeout_seconds)
    request_id = kv.next_request_id
    kv.next_request_id += 1
    try:
        answer = await connection.request(
            make_request(request_id), request_id, attempt_deadline, deadline
        )
    except ATTEMPT_ERRORS as error:
        # As the retry loop's lost attempt: the peer may be gone without a word.
        await kv.drop_connection(endpoint, connection)
        attempts = attempts_after(transport, what, selector, deadline, attempt_timeout_seconds)
        attempts.lost(endpoint, error)
        await transport.follow_moved_replicas(attempts, (topic, partition))
        return attempts
    if isinstance(answer, ProduceResult):
        return answer
    attempts = attempts_after(transport, what, selector, deadline, attempt_timeout_seconds)
    if isinstance(answer, ErrorResponse) and answer.code is ErrorCode.NOT_FOUND:
        await transport.replica_not_found(topic, partition, attempts, endpoint, answer)
        return attempts
    attempts.answered(endpoint, answer, ProduceResult)  # raises on a refusal
    return attempts


def attempts_after(
    transport: StreamTransport,
    what: Callable[[], str],
    selector: EndpointSelector,
    deadline: float,
    attempt_timeout_seconds: float,
) -> TrackedAttempts:
    """The retry loop's attempts for this request, made after its first attempt was sent
    (same selector, same deadline)."""
    remaining_seconds = deadline - asyncio.get_running_loop().time()
    attempts = transport.attempts(
        what(),
        selector,
        side_effects=True,
        timeout_seconds=remaining_seconds,
        attempt_timeout_seconds=attempt_timeout_seconds,
    )
    attempts.deadline = deadline  # exactly the first attempt's, not a moment later
    attempts.sent()
    return attempts


__all__ = ["produce_at_known_leader"]
