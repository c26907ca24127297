"""What clients send and how they read auth answers: etcdctl's --user form, the sources
of credentials, the answers that replace a connection, and the Spark options."""

from __future__ import annotations

import pytest

from quorumlog.auth.credentials import (
    AuthenticationBusyError,
    Credentials,
    credentials_source,
    parse_user,
    screen_answer,
    token_from,
)
from quorumlog.codec import wire
from quorumlog.errors import AuthenticationRequiredError
from quorumlog.spark.errors import OptionError
from quorumlog.spark.options import Options, parse_connection


def test_user_forms() -> None:
    assert parse_user("alice:pw") == Credentials("alice", "pw")
    assert parse_user("alice:p:w") == Credentials("alice", "p:w")
    assert parse_user("alice", "given") == Credentials("alice", "given")
    assert "pw" not in repr(parse_user("alice:pw"))
    with pytest.raises(ValueError):
        parse_user(":pw")


def test_sources() -> None:
    assert credentials_source(None, None) is None
    source = credentials_source("alice", "pw")
    assert source is not None and source() == Credentials("alice", "pw")
    with pytest.raises(ValueError):
        credentials_source(None, "pw")


def error(code: wire.ErrorCode) -> wire.ErrorResponse:
    return wire.ErrorResponse(request_id=5, code=code, message="m")


def test_answers_that_replace_the_connection() -> None:
    done = wire.Done(request_id=5)
    assert screen_answer(done, authenticated=True) == (done, False)
    invalid = error(wire.ErrorCode.AUTH_TOKEN_INVALID)
    assert screen_answer(invalid, authenticated=False) == (invalid, True)
    required = error(wire.ErrorCode.AUTHENTICATION_REQUIRED)
    assert screen_answer(required, authenticated=False) == (required, True)
    retried, replace = screen_answer(required, authenticated=True)
    assert replace and isinstance(retried, wire.ErrorResponse)
    assert retried.code is wire.ErrorCode.AUTH_TOKEN_INVALID and retried.request_id == 5
    denied = error(wire.ErrorCode.PERMISSION_DENIED)
    assert screen_answer(denied, authenticated=True) == (denied, False)


def test_authenticate_answers() -> None:
    assert token_from(wire.AuthenticateResult(request_id=0, token="t"), "e") == "t"
    with pytest.raises(AuthenticationRequiredError):
        token_from(error(wire.ErrorCode.AUTHENTICATION_FAILED), "e")
    with pytest.raises(AuthenticationBusyError):  # a ConnectionError: retried like a dial
        token_from(error(wire.ErrorCode.PENDING_FULL), "e")


def test_spark_connection_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUORUMLOG_USER", raising=False)
    monkeypatch.delenv("QUORUMLOG_PASSWORD", raising=False)
    known = ("endpoints", "clusterId", "timeoutMs", "user", "password")
    options = Options({"endpoints": "127.0.0.1:1", "user": "carol", "password": "pw"}, known, "t")
    parsed = parse_connection(options)
    assert (parsed.user, parsed.password) == ("carol", "pw")
    assert "pw" not in repr(parsed)
    with pytest.raises(OptionError, match="password"):
        parse_connection(Options({"endpoints": "127.0.0.1:1", "password": "pw"}, known, "t"))
