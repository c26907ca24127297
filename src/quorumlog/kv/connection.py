"""What the blocking and the asyncio KV clients share; no I/O lives here.

- endpoints: parsing "host:port", and `EndpointSelector`, which picks whom to ask next
  (the cached leader, a node named in a NOT_LEADER hint, else the next endpoint in turn);
- the handshake: the `Hello` a client sends and how it reads the answer;
- `SequenceTracker`: sequence numbers and `first_unacknowledged` for one client id, and
  `ClientSession`, the two together;
- `RequestAttempts`: the retry rules for one request, fed each attempt's outcome, deciding
  whether to try again (where, after what back-off) and, at the deadline, which error to
  raise: `UnknownOutcomeError` if some attempt may have reached a node, else
  `UnavailableError`.

How the clients read the node's error codes (the node's side is `node/errors_to_wire.py`):
NOT_LEADER, PENDING_FULL and TRANSFERRING mean "not accepted here": retry elsewhere or
later. UNAVAILABLE, TIMEOUT and INTERNAL may come after a proposal was appended, so a write
that got one may still take effect; it is retried (with the same sequence) all the same.
SESSION_EXPIRED (as an error code, or as the error of a write's results) means the cluster
no longer has the client's session and refused the write: it is raised as
`SessionExpiredError` at once, and the client goes on under a new session (a new client id,
sequences from 1). Every other code is a refusal of the request itself and is raised as
`RequestRejectedError` at once.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable
from typing import TypeVar

import msgspec

from quorumlog.codec.frame import encode_frame
from quorumlog.codec.wire import (
    FIRST_SEQUENCE,
    ErrorCode,
    ErrorResponse,
    Frame,
    Hello,
    KVCommand,
    KVCommandResult,
    KVWriteResult,
    Refused,
    StatusResponse,
    Welcome,
    encode,
)
from quorumlog.errors import (
    AuthenticationRequiredError,
    ClientError,
    ConnectionRefusedByNodeError,
    NotEnoughReplicasUnavailableError,
    PermissionDeniedError,
    RequestRejectedError,
    ReservedKeyError,
    SessionExpiredError,
    UnavailableError,
    UnknownOutcomeError,
)
from quorumlog.tls.handshake import TLS_REQUIRED_REASON, plaintext_to_tls_error

CLUSTER_ID_DEFAULT = "quorumlog"
ATTEMPT_TIMEOUT_SECONDS_MAX = 1.0
"""How long one attempt waits for its answer before the client tries another node: about
one election, so a leader that went silent is given up on once a successor can exist."""
BACKOFF_SECONDS_INITIAL = 0.005
BACKOFF_SECONDS_MAX = 0.25

NOT_ACCEPTED_CODES = frozenset(
    {ErrorCode.NOT_LEADER, ErrorCode.PENDING_FULL, ErrorCode.TRANSFERRING}
)
MAYBE_APPLIED_CODES = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT, ErrorCode.INTERNAL})
BUSY_CODES = frozenset(
    {
        ErrorCode.PENDING_FULL,
        ErrorCode.TRANSFERRING,
        ErrorCode.UNAVAILABLE,
        ErrorCode.TIMEOUT,
        ErrorCode.INTERNAL,
        ErrorCode.CONFIGURATION_IN_PROGRESS,
        ErrorCode.NOT_ENOUGH_REPLICAS,
    }
)
"""Codes that mean "this node cannot now": wait a little before the next attempt."""

ResponseType = TypeVar("ResponseType")


# --- endpoints ---------------------------------------------------------------------------


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) from "host:port" (IPv6 as "[::1]:2379"); ValueError if malformed."""
    host, separator, port_text = endpoint.strip().rpartition(":")
    if not separator or not host or not port_text.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"endpoint {endpoint!r}: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def parse_endpoints(text: str) -> list[str]:
    """Comma-separated "host:port" list, checked; ValueError if empty or malformed."""
    endpoints = [part.strip() for part in text.split(",") if part.strip()]
    if not endpoints:
        raise ValueError("no endpoints given")
    for endpoint in endpoints:
        parse_endpoint(endpoint)
    return endpoints


class EndpointSelector:
    """Whom to ask next. Prefers the cached leader; otherwise walks the endpoints in turn."""

    def __init__(self, endpoints: list[str]) -> None:
        if not endpoints:
            raise ValueError("a client needs at least one endpoint")
        for endpoint in endpoints:
            parse_endpoint(endpoint)
        self.endpoints = list(endpoints)
        self.leader: str | None = None
        self.position = 0

    def choose(self) -> str:
        return self.leader if self.leader is not None else self.endpoints[self.position]

    def succeeded_at_leader(self, endpoint: str) -> None:
        self.leader = endpoint

    def failed(self, endpoint: str) -> None:
        """`endpoint` could not serve: forget it as leader and move past it."""
        if self.leader == endpoint:
            self.leader = None
        if endpoint in self.endpoints:
            self.position = (self.endpoints.index(endpoint) + 1) % len(self.endpoints)

    def hinted(self, endpoint: str, hint: str | None) -> bool:
        """`endpoint` said it is not the leader; follow its hint if usable. True if followed."""
        if hint is None or hint == endpoint or not is_endpoint(hint):
            self.failed(endpoint)
            return False
        # The hint may name a node missing from our list (we were given only some of them).
        self.leader = hint
        return True


def is_endpoint(text: str) -> bool:
    try:
        parse_endpoint(text)
    except ValueError:
        return False
    return True


# --- handshake ---------------------------------------------------------------------------


def hello_frame(cluster_id: str, client_id: str) -> bytes:
    return encode_frame(encode(Hello(cluster_id=cluster_id, sender=client_id, is_peer=False)))


def welcome_node_id(frame: Frame, endpoint: str) -> str:
    """The node id from the handshake answer; raises if the node refused us."""
    if isinstance(frame, Welcome):
        return frame.node_id
    if isinstance(frame, Refused):
        if frame.reason == TLS_REQUIRED_REASON:
            raise plaintext_to_tls_error(endpoint)
        raise ConnectionRefusedByNodeError(f"{endpoint} refused the connection: {frame.reason}")
    raise ClientError(f"{endpoint} answered the handshake with {type(frame).__name__}")


# --- sequences ---------------------------------------------------------------------------

CommandIdentity = tuple[str, str, str | None, str | None]
"""(op, key, value, expected): what makes a repeated call "the same call"."""


class SequenceTracker:
    """Sequence numbers for one client id, and the lowest one still awaiting its answer.

    A call that ended in UnknownOutcomeError keeps its sequence reserved for
    `hold_seconds`: repeating the same call (same op, key and values) in that time reuses
    the sequence, so the cluster applies it at most once. After that it is released, so
    `first_unacknowledged` moves on and the cluster can forget the results below it.
    """

    def __init__(self, hold_seconds: float) -> None:
        self.hold_seconds = hold_seconds
        self.next_sequence = FIRST_SEQUENCE
        self.outstanding: list[int] = []
        """A heap of sequences handed out; entries in `done` are removed lazily."""
        self.done: set[int] = set()
        self.held: dict[CommandIdentity, tuple[int, float]] = {}

    def allocate(self, identity: CommandIdentity, now: float) -> int:
        self.release_expired(now)
        held = self.held.pop(identity, None)
        if held is not None:
            return held[0]
        sequence = self.next_sequence
        self.next_sequence += 1
        heapq.heappush(self.outstanding, sequence)
        return sequence

    def acknowledge(self, sequence: int) -> None:
        self.done.add(sequence)
        outstanding = self.outstanding
        done = self.done
        while outstanding and outstanding[0] in done:
            done.discard(heapq.heappop(outstanding))

    def hold_unknown(self, sequence: int, identity: CommandIdentity, now: float) -> None:
        previous = self.held.get(identity)
        if previous is not None:
            self.acknowledge(previous[0])
        self.held[identity] = (sequence, now + self.hold_seconds)

    def release_expired(self, now: float) -> None:
        if not self.held:
            return
        for identity, (sequence, release_at) in list(self.held.items()):
            if release_at <= now:
                del self.held[identity]
                self.acknowledge(sequence)

    def next_release_at(self) -> float | None:
        """When the earliest reserved sequence is released, if any is reserved."""
        return min((release_at for _, release_at in self.held.values()), default=None)

    def first_unacknowledged(self) -> int:
        return self.outstanding[0] if self.outstanding else self.next_sequence

    def unacknowledged_span(self) -> int:
        """How many sequences from the lowest unanswered one to the next to hand out."""
        return self.next_sequence - self.first_unacknowledged()


def new_client_id() -> str:
    return uuid.uuid4().hex


class ClientSession:
    """A client id and the sequences numbered under it. When the cluster says the session
    is gone (SessionExpiredError), a client starts a new one: a fresh id, sequences from 1,
    which the cluster takes for a new client."""

    __slots__ = ("answered", "client_id", "new_id", "sequences")

    def __init__(
        self,
        client_id: str,
        hold_seconds: float,
        new_id: Callable[[], str] = new_client_id,
    ) -> None:
        self.client_id = client_id
        self.new_id = new_id
        """Where the id of a renewed session comes from (the simulator numbers them, so
        a seed replays the same ids)."""
        self.sequences = SequenceTracker(hold_seconds)
        self.answered = False
        """True once the cluster answered a write of this session: it then has (or had)
        a session for this client."""

    def first_unacknowledged(self) -> int:
        """What a write reports as its `first_unacknowledged`: FIRST_SEQUENCE until a write
        was answered. Sequences released after an unknown outcome count as acknowledged
        here, yet the cluster may never have seen them; reporting more than 1 before any
        answer would make the cluster take this new client for one whose session it lost."""
        if not self.answered:
            return FIRST_SEQUENCE
        return self.sequences.first_unacknowledged()

    def renewed(self) -> ClientSession:
        return ClientSession(self.new_id(), self.sequences.hold_seconds, self.new_id)


class SessionHolder:
    """A client whose writes go under `session`, replaced by a new one when it is gone."""

    session: ClientSession

    @property
    def client_id(self) -> str:
        """The current session's id (a new one after SessionExpiredError)."""
        return self.session.client_id

    @property
    def sequences(self) -> SequenceTracker:
        return self.session.sequences

    def renew_session(self, expired: ClientSession) -> None:
        """The cluster no longer has `expired`: later calls go under a new session (once,
        however many calls of the old one are refused)."""
        if self.session is expired:
            self.session = expired.renewed()


def command_identity(command: KVCommand) -> CommandIdentity:
    return (command.op, command.key, command.value, command.expected)


# --- results -----------------------------------------------------------------------------


def write_results(
    response: KVWriteResult, command_count: int, endpoint: str
) -> list[KVCommandResult]:
    """The results of a write; SessionExpiredError if the cluster refused it for that."""
    if len(response.results) != command_count:
        raise ClientError(
            f"{endpoint} answered {command_count} commands with {len(response.results)} results"
        )
    for result in response.results:
        if result.error is ErrorCode.SESSION_EXPIRED:
            raise SessionExpiredError(
                f"{endpoint}: the cluster no longer has this client's session (it expired "
                f"or was evicted); the write was not carried out"
            )
    return response.results


def check_command_result(command: KVCommand, result: KVCommandResult) -> KVCommandResult:
    """A result as the caller sees it: ok=False is an answer for "cas", a refusal otherwise
    (and always when the result carries an error)."""
    if result.error is ErrorCode.SESSION_EXPIRED:
        raise SessionExpiredError(f"the cluster refused {command.op} {command.key!r}")
    if result.error is not None:
        raise RequestRejectedError(
            result.error.value, f"the cluster refused {command.op} {command.key!r}"
        )
    if not result.ok and command.op != "cas":
        raise RequestRejectedError(
            "bad_request", f"the cluster could not {command.op} {command.key!r}"
        )
    return result


class Member(msgspec.Struct, frozen=True):
    node_id: str
    address: str | None
    role: str
    """"voter" or "learner"."""
    is_leader: bool


def members_from_status(status: StatusResponse) -> list[Member]:
    members = [
        Member(node_id, status.addresses.get(node_id), "voter", node_id == status.leader)
        for node_id in status.voters
    ]
    members += [
        Member(node_id, status.addresses.get(node_id), "learner", False)
        for node_id in status.learners
    ]
    return members


# --- retry rules -------------------------------------------------------------------------


class Attempt(msgspec.Struct, frozen=True):
    endpoint: str
    delay_seconds: float
    """Wait this long before dialling (back-off)."""
    deadline: float
    """When this attempt stops waiting for its answer (monotonic seconds)."""


class RequestAttempts:
    """The retry rules for one request; the caller does the I/O and reports what happened.

    `side_effects`: the request changes the cluster, so an attempt that may have reached a
    node makes the final error UnknownOutcomeError. `retry_after_delivery`: such a request
    may be sent again after it may have arrived (true for KV writes, which sessions dedup;
    false for membership changes, which are not idempotent).
    """

    def __init__(
        self,
        what: str,
        selector: EndpointSelector,
        clock: Callable[[], float],
        timeout_seconds: float,
        attempt_timeout_seconds: float,
        side_effects: bool,
        retry_after_delivery: bool = True,
        fixed_endpoint: str | None = None,
    ) -> None:
        self.what = what
        self.selector = selector
        self.clock = clock
        self.timeout_seconds = timeout_seconds
        self.deadline = clock() + timeout_seconds
        self.attempt_timeout_seconds = attempt_timeout_seconds
        self.side_effects = side_effects
        self.retry_after_delivery = retry_after_delivery
        self.fixed_endpoint = fixed_endpoint
        self.maybe_delivered = False
        self.last_error = "no attempt made"
        self.failures_in_row = 0
        self.backoff_seconds = BACKOFF_SECONDS_INITIAL
        self.delay_seconds = 0.0
        self.finished = False
        self.replicas_too_few = False
        """The latest answer was NOT_ENOUGH_REPLICAS (nothing written): said at give-up."""
        self.maybe_applied = False
        """An attempt went unanswered or was answered with a MAYBE_APPLIED code: unlike
        `maybe_delivered`, refusals that say nothing was done do not set it."""

    def next(self) -> Attempt | None:
        """The next attempt, or None when it is time to give up (see `give_up_error`)."""
        if self.finished:
            return None
        now = self.clock()
        start = now + self.delay_seconds
        if start >= self.deadline:
            return None
        endpoint = self.fixed_endpoint or self.selector.choose()
        deadline = min(self.deadline, start + self.attempt_timeout_seconds)
        return Attempt(endpoint, self.delay_seconds, deadline)

    def give_up_error(self) -> ClientError:
        if self.replicas_too_few and not self.maybe_applied:
            return NotEnoughReplicasUnavailableError(
                f"{self.what}: refused for too few in-sync replicas until the deadline, "
                f"{self.timeout_seconds:g}s (last error: {self.last_error})"
            )
        if self.side_effects and self.maybe_delivered:
            return UnknownOutcomeError(
                f"{self.what}: no answer in time; it may or may not have taken effect "
                f"(last error: {self.last_error})"
            )
        return UnavailableError(
            f"{self.what}: no node could serve it within {self.timeout_seconds:g}s "
            f"(last error: {self.last_error})"
        )

    # --- outcomes of an attempt ---------------------------------------------------------

    def connect_failed(self, endpoint: str, error: BaseException) -> None:
        """Could not open a connection: the request certainly did not arrive."""
        self.replicas_too_few = False
        self.last_error = f"{endpoint}: {describe(error)}"
        self.selector.failed(endpoint)
        self.failed_once(busy=False)
        if self.fixed_endpoint is not None:
            # Only that node can answer (a status query): say so now, not at the deadline.
            self.finished = True

    def sent(self) -> None:
        self.maybe_delivered = True

    def lost(self, endpoint: str, error: BaseException) -> None:
        """Sent (perhaps partly) and then no answer: the connection broke or time ran out."""
        self.replicas_too_few = False
        self.maybe_delivered = True
        self.maybe_applied = True
        self.last_error = f"{endpoint}: {describe(error)}"
        self.selector.failed(endpoint)
        if not self.retry_after_delivery or self.fixed_endpoint is not None:
            self.finished = True
        self.failed_once(busy=False)

    def answered(
        self, endpoint: str, frame: Frame, expected: type[ResponseType]
    ) -> ResponseType | None:
        """The answer if it is the one wanted; None to try again; raises on a refusal."""
        if isinstance(frame, expected):
            return frame
        if not isinstance(frame, ErrorResponse):
            raise ClientError(f"{endpoint} answered {self.what} with {type(frame).__name__}")
        self.last_error = f"{endpoint}: {frame.code.value}: {frame.message}"
        code = frame.code
        self.replicas_too_few = code is ErrorCode.NOT_ENOUGH_REPLICAS
        if code is ErrorCode.NOT_LEADER:
            followed = self.fixed_endpoint is None and self.selector.hinted(
                endpoint, frame.leader_hint
            )
            self.failed_once(busy=not followed)
            return None
        if code in MAYBE_APPLIED_CODES:
            self.maybe_delivered = True
            self.maybe_applied = True
            if not self.retry_after_delivery:
                self.finished = True
        if code in BUSY_CODES:
            self.failed_once(busy=True)
            return None
        if code is ErrorCode.SESSION_EXPIRED:
            raise SessionExpiredError(f"{endpoint}: {frame.message}")
        if code is ErrorCode.AUTH_TOKEN_INVALID:
            # The connection that carried it is dropped; the next one authenticates anew.
            self.failed_once(busy=False)
            return None
        if code is ErrorCode.PERMISSION_DENIED:
            raise PermissionDeniedError(f"{endpoint}: {frame.message}")
        if code in (ErrorCode.AUTHENTICATION_REQUIRED, ErrorCode.AUTHENTICATION_FAILED):
            raise AuthenticationRequiredError(f"{endpoint}: {frame.message}", code.value)
        if code is ErrorCode.RESERVED_KEY:
            raise ReservedKeyError(frame.message)
        raise RequestRejectedError(code.value, frame.message)

    def failed_once(self, busy: bool) -> None:
        """Choose the pause before the next attempt: none while there are untried nodes,
        then a bounded exponential back-off (also at once when a node said it is busy)."""
        self.failures_in_row += 1
        if busy or self.failures_in_row > len(self.selector.endpoints):
            self.delay_seconds = self.backoff_seconds
            self.backoff_seconds = min(self.backoff_seconds * 2, BACKOFF_SECONDS_MAX)
        else:
            self.delay_seconds = 0.0


def describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def attempt_timeout_for(timeout_seconds: float, attempt_timeout_seconds: float | None) -> float:
    if attempt_timeout_seconds is not None:
        if attempt_timeout_seconds <= 0:
            raise ValueError(
                f"attempt_timeout_seconds must be positive, got {attempt_timeout_seconds}"
            )
        return attempt_timeout_seconds
    return min(timeout_seconds, ATTEMPT_TIMEOUT_SECONDS_MAX)


def check_timeout(timeout: float) -> None:
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout}")
