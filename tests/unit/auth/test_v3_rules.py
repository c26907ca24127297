"""The etcd-style KV calls against a user's rights: a txn's compares and gets need read,
its puts and deletes write (ranges: on the whole range); ranges and watches need read;
leases any authenticated user; compaction root only; the auth state is never written this
way, not even by root."""

from __future__ import annotations

from quorumlog.auth.matcher import Rights
from quorumlog.auth.model import Access, Permission, PermissionKind, Role
from quorumlog.auth.rules import request_denial
from quorumlog.codec import kv_v3, wire

ROOT = Rights([], ["root"])
APP = Rights(
    [
        Role(
            name="app",
            permissions=[Permission(PermissionKind.KEY, Access.READWRITE, "app/", "app0")],
        )
    ],
    ["app"],
)


def v3_write(command: kv_v3.V3Command) -> wire.KVWrite:
    payload = kv_v3.encode_command(command)
    return wire.KVWrite(
        request_id=1,
        client_id="c",
        commands=[wire.KVCommand(1, kv_v3.V3_OP, "put 'x'", None, None, payload=payload)],
    )


def txn(*operations: kv_v3.RequestOp, compares: list[kv_v3.Compare] | None = None) -> wire.KVWrite:
    return v3_write(kv_v3.Txn(compares or [], list(operations), []))


def test_txn_operations_need_their_rights() -> None:
    assert request_denial(APP, txn(kv_v3.RequestOp("put", "app/x", value=b"v"))) is None
    assert request_denial(APP, txn(kv_v3.RequestOp("put", "other/x", value=b"v"))) is not None
    assert request_denial(APP, txn(kv_v3.RequestOp("delete", "app/", end="app0"))) is None
    assert request_denial(APP, txn(kv_v3.RequestOp("delete", "app/", end="\x00"))) is not None
    assert request_denial(APP, txn(kv_v3.RequestOp("get", "other/", end="other0"))) is not None
    compare = kv_v3.Compare("version", "other/k", "==", 0)
    guarded = txn(kv_v3.RequestOp("put", "app/x", value=b"v"), compares=[compare])
    assert request_denial(APP, guarded) is not None
    assert request_denial(ROOT, guarded) is None


def test_not_even_root_writes_the_auth_state_through_a_txn() -> None:
    assert (
        request_denial(ROOT, txn(kv_v3.RequestOp("put", "__auth/users", value=b"[]"))) is not None
    )
    assert request_denial(ROOT, txn(kv_v3.RequestOp("delete", "", end="\x00"))) is not None


def test_ranges_watches_leases_and_compaction() -> None:
    assert request_denial(APP, wire.KVRangeRequest(request_id=1, key="app/", end="app0")) is None
    assert request_denial(APP, wire.KVRangeRequest(request_id=1, key="", end="\x00")) is not None
    assert request_denial(APP, wire.WatchPoll(request_id=1, key="app/x")) is None
    assert request_denial(APP, wire.WatchPoll(request_id=1, key="other/x")) is not None
    assert request_denial(APP, v3_write(kv_v3.LeaseGrant(10))) is None
    assert request_denial(APP, wire.LeaseTimeToLiveRequest(request_id=1, lease_id=5)) is None
    assert request_denial(APP, v3_write(kv_v3.Compact(3))) is not None
    assert request_denial(ROOT, v3_write(kv_v3.Compact(3))) is None
