"""The node's checks: tokens (issue, expiry, invalidation) and the right each request needs."""

from __future__ import annotations

import msgspec

from quorumlog.auth.commands import (
    AuthCommand,
    AuthEnable,
    RoleAdd,
    RoleGrantPermission,
    UserAdd,
    UserChangePassword,
    UserGrantRole,
    apply_decoded,
)
from quorumlog.auth.guard import AuthGuard
from quorumlog.auth.model import (
    NODE_USER,
    Access,
    Permission,
    PermissionKind,
    hash_password,
    prefix_range_end,
)
from quorumlog.auth.state import AuthStateView
from quorumlog.codec import wire


class World:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.generation = 0
        self.now = 0.0
        self.guard = AuthGuard(
            AuthStateView(lambda: self.data, lambda: self.generation),
            lambda: self.now,
            token_ttl_seconds=10.0,
        )
        self.replies: list[wire.Frame] = []

    def run(self, command: AuthCommand) -> None:
        apply_decoded(self.data, command)
        self.generation += 1

    def send(self, request: wire.ClientRequest) -> wire.ClientRequest | None:
        return self.guard.admit(request, self.replies.append)

    def last_code(self) -> wire.ErrorCode | None:
        reply = self.replies[-1]
        return reply.code if isinstance(reply, wire.ErrorResponse) else None

    def token(self, user: str, password: str) -> str:
        self.send(wire.Authenticate(request_id=1, user=user, password=password))
        reply = self.replies[-1]
        assert isinstance(reply, wire.AuthenticateResult), reply
        return reply.token


def enabled_world() -> World:
    world = World()
    world.run(UserAdd(name="root", password_hash=hash_password("rootpw", 10)))
    world.run(UserGrantRole(name="root", role="root"))
    world.run(UserAdd(name="alice", password_hash=hash_password("alicepw", 10)))
    world.run(RoleAdd(name="app"))
    app = Permission(PermissionKind.KEY, Access.READWRITE, "app/", prefix_range_end("app/"))
    world.run(RoleGrantPermission(name="app", permission=app))
    world.run(UserGrantRole(name="alice", role="app"))
    world.run(AuthEnable(node_secret="node-secret"))
    return world


def put(key: str, token: str) -> wire.AuthenticatedRequest:
    write = wire.KVWrite(request_id=7, client_id="c", commands=[wire.KVCommand(1, "put", key, "v")])
    return wire.AuthenticatedRequest(request_id=7, token=token, request=write)


def test_with_auth_off_requests_pass_untouched() -> None:
    world = World()
    request = wire.KVRead(request_id=3, keys=["__auth/users"])
    assert not world.guard.enabled()
    assert world.send(request) is request
    assert world.token("nobody", "x") == ""


def test_unauthenticated_and_wrong_password_are_refused() -> None:
    world = enabled_world()
    assert world.send(wire.KVRead(request_id=3, keys=["app/x"])) is None
    assert world.last_code() is wire.ErrorCode.AUTHENTICATION_REQUIRED
    world.send(wire.Authenticate(request_id=1, user="alice", password="wrong"))
    assert world.last_code() is wire.ErrorCode.AUTHENTICATION_FAILED
    # The bookie protocol is node-to-node and not checked by role.
    read = wire.ReadEntries(request_id=4, ledger_id=1, first_entry_id=0, last_entry_id=0)
    assert world.send(read) is read


def test_roles_decide_per_key() -> None:
    world = enabled_world()
    token = world.token("alice", "alicepw")
    assert isinstance(world.send(put("app/x", token)), wire.KVWrite)
    assert world.send(put("other/x", token)) is None
    assert world.last_code() is wire.ErrorCode.PERMISSION_DENIED
    assert world.send(put("__auth/users", world.token("root", "rootpw"))) is None
    remove = wire.MemberChangeRequest(request_id=8, kind="remove", node_id="n2")
    assert world.send(wire.AuthenticatedRequest(request_id=8, token=token, request=remove)) is None
    assert world.last_code() is wire.ErrorCode.PERMISSION_DENIED


def test_tokens_expire_unused_and_end_with_a_new_password() -> None:
    world = enabled_world()
    token = world.token("alice", "alicepw")
    world.now = 9.0
    assert world.send(put("app/x", token)) is not None  # renews the token
    world.now = 18.0
    assert world.send(put("app/x", token)) is not None
    world.now = 28.5
    assert world.send(put("app/x", token)) is None
    assert world.last_code() is wire.ErrorCode.AUTH_TOKEN_INVALID
    token = world.token("alice", "alicepw")
    world.run(UserChangePassword(name="alice", password_hash=hash_password("new", 10)))
    assert world.send(put("app/x", token)) is None
    assert world.last_code() is wire.ErrorCode.AUTH_TOKEN_INVALID


def test_nodes_authenticate_with_the_node_secret() -> None:
    world = enabled_world()
    world.send(wire.Authenticate(request_id=1, user=NODE_USER, password="guess"))
    assert world.last_code() is wire.ErrorCode.AUTHENTICATION_FAILED
    token = world.token(NODE_USER, "node-secret")
    assert isinstance(world.send(put("__ledgers/1", token)), wire.KVWrite)


def test_a_token_from_before_auth_enable_is_not_trusted_after() -> None:
    world = World()
    world.run(UserAdd(name="root", password_hash=hash_password("rootpw", 10)))
    world.run(UserGrantRole(name="root", role="root"))
    token = world.token("mallory", "anything")
    assert token == ""  # auth off: nothing checked, nothing issued
    world.run(AuthEnable(node_secret="s"))
    assert world.send(put("app/x", "made-up")) is None
    assert world.last_code() is wire.ErrorCode.AUTH_TOKEN_INVALID


def test_password_checks_wait_off_the_loop_and_are_bounded() -> None:
    world = enabled_world()
    queued: list[tuple[object, object]] = []
    world.guard.offload = lambda work, done: queued.append((work, done))
    world.guard.hashes_pending_max = 2
    for _ in range(3):
        world.send(wire.Authenticate(request_id=1, user="alice", password="alicepw"))
    assert len(queued) == 2 and world.last_code() is wire.ErrorCode.PENDING_FULL
    work, done = queued[0]
    done(work())  # type: ignore[operator]
    reply = world.replies[-1]
    assert isinstance(reply, wire.AuthenticateResult) and reply.token
    assert world.guard.hashes_pending == 1


def test_a_certificate_common_name_stands_for_the_password() -> None:
    world = enabled_world()
    hello = wire.Authenticate(request_id=1, user="alice", password="")
    world.guard.admit(hello, world.replies.append, peer_common_name="alice")
    reply = world.replies[-1]
    assert isinstance(reply, wire.AuthenticateResult) and reply.token
    assert isinstance(world.send(put("app/x", reply.token)), wire.KVWrite)
    # Another name than the certificate's, or no certificate: the password is checked.
    world.guard.admit(
        wire.Authenticate(request_id=1, user="root", password=""),
        world.replies.append,
        peer_common_name="alice",
    )
    assert world.last_code() is wire.ErrorCode.AUTHENTICATION_FAILED
    world.send(hello)
    assert world.last_code() is wire.ErrorCode.AUTHENTICATION_FAILED


def test_a_replica_behind_checks_a_refused_password_once_more() -> None:
    world = enabled_world()
    later: list[object] = []
    world.guard.is_authority = lambda: False
    world.guard.call_later = lambda delay, callback: later.append(callback)
    world.send(wire.Authenticate(request_id=1, user="erin", password="erinpw"))
    assert len(later) == 1 and not world.replies  # not refused yet
    world.run(UserAdd(name="erin", password_hash=hash_password("erinpw", 10)))  # applied now
    later.pop()()  # type: ignore[operator]
    reply = world.replies[-1]
    assert isinstance(reply, wire.AuthenticateResult) and reply.token
    world.send(wire.Authenticate(request_id=1, user="erin", password="wrong"))
    later.pop()()  # type: ignore[operator]
    assert world.last_code() is wire.ErrorCode.AUTHENTICATION_FAILED and not later


def test_a_request_type_no_rule_names_is_roots_only() -> None:
    from quorumlog.auth.matcher import Rights
    from quorumlog.auth.rules import request_denial

    class FutureRequest(msgspec.Struct):
        request_id: int

    alice = Rights([], ["app"])
    denial = request_denial(alice, FutureRequest(request_id=1))  # type: ignore[arg-type]
    assert denial is not None and "only root" in denial
    assert request_denial(Rights([], ["root"]), FutureRequest(request_id=1)) is None  # type: ignore[arg-type]
    assert request_denial(alice, wire.ListTopics(request_id=1)) is None
