"""What every replicated-command service checks first: the shard controller, the HA
controller and the consumer-group coordinator each take a request carrying encoded
commands, and refuse it the same way when its commands do not decode (BAD_REQUEST), when
there are none or too many (BAD_REQUEST), or when this node does not lead the group
(NOT_LEADER with the leader's address, so the client follows it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from quorumlog.codec import wire
from quorumlog.errors import NotLeaderError
from quorumlog.node.errors_to_wire import error_response
from quorumlog.runtime.handle import GroupHandle

Replier = Callable[[wire.Frame], None]
Command = TypeVar("Command")


def accepted_commands(
    request_id: int,
    data: bytes,
    decode: Callable[[bytes], Sequence[Command]],
    commands_max: int,
    group: GroupHandle,
    leader_address: Callable[[], str | None],
    reply: Replier,
    what: str = "commands",
) -> list[Command] | None:
    """The request's commands if this leader may act on them; else None, once `reply` has
    been given the refusal."""
    try:
        commands = list(decode(data))
    except wire.DECODE_ERRORS as error:
        bad_request(reply, request_id, f"{what} do not decode: {error}")
        return None
    if not commands or len(commands) > commands_max:
        bad_request(reply, request_id, f"{len(commands)} commands; send 1 to {commands_max}")
        return None
    if not group.is_leader:
        reply(
            error_response(
                request_id, NotLeaderError(group.node_id, group.leader_id), leader_address
            )
        )
        return None
    return commands


def bad_request(reply: Replier, request_id: int, message: str) -> None:
    reply(
        wire.ErrorResponse(request_id=request_id, code=wire.ErrorCode.BAD_REQUEST, message=message)
    )


__all__ = ["accepted_commands", "bad_request"]
