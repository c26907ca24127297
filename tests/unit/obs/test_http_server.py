"""The node's small HTTP server: good requests answered, bad input refused with its status."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from quorumlog.obs import http_server
from quorumlog.obs.http_server import HEADER_BYTES_MAX, HttpServer, Response, parse_request_head

READ_TIMEOUT_SECONDS = 5.0


async def hello() -> Response:
    return Response(200, b"hello")


async def slow() -> Response:
    await asyncio.sleep(60)  # stands for a handler that hangs; the server's timeout cuts it
    return Response(200, b"late")


def run_with_server(scenario: Callable[[int], Awaitable[None]]) -> None:
    async def main() -> None:
        server = HttpServer({"/": hello, "/slow": slow})
        port = await server.start("127.0.0.1", 0)
        try:
            await scenario(port)
        finally:
            await server.close()

    asyncio.run(main())


async def exchange(port: int, request: bytes) -> bytes:
    """Send `request` raw and read the whole answer (the server closes after one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), READ_TIMEOUT_SECONDS)
    writer.close()
    await writer.wait_closed()
    return answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def answer_to(request: bytes) -> bytes:
    answers: list[bytes] = []

    async def scenario(port: int) -> None:
        answers.append(await exchange(port, request))

    run_with_server(scenario)
    return answers[0]


def test_a_get_is_answered_with_its_body_and_length() -> None:
    answer = answer_to(b"GET /?refresh=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(answer) == 200
    assert b"Content-Length: 5\r\n" in answer
    assert answer.endswith(b"\r\n\r\nhello")


def test_a_head_gets_the_head_only() -> None:
    answer = answer_to(b"HEAD / HTTP/1.1\r\n\r\n")
    assert status_of(answer) == 200
    assert answer.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"GET noslash HTTP/1.1\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /\xff HTTP/1.1\r\n\r\n",
    ],
)
def test_a_malformed_request_gets_400(request_bytes: bytes) -> None:
    assert status_of(answer_to(request_bytes)) == 400


def test_a_request_cut_short_gets_400() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n")
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), READ_TIMEOUT_SECONDS)
        writer.close()
        assert status_of(answer) == 400

    run_with_server(scenario)


def test_oversized_headers_get_431() -> None:
    padding = b"X-Padding: " + b"a" * HEADER_BYTES_MAX + b"\r\n"
    assert status_of(answer_to(b"GET / HTTP/1.1\r\n" + padding + b"\r\n")) == 431


@pytest.mark.parametrize("method", [b"POST", b"PUT", b"DELETE"])
def test_a_method_other_than_get_gets_405(method: bytes) -> None:
    answer = answer_to(method + b" / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert status_of(answer) == 405
    assert b"\r\nAllow: GET, HEAD\r\n" in answer


def test_an_unknown_path_gets_404() -> None:
    assert status_of(answer_to(b"GET /secrets HTTP/1.1\r\n\r\n")) == 404


def test_a_client_too_slow_to_send_its_head_gets_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "REQUEST_TIMEOUT_SECONDS", 0.2)

    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n")  # and nothing more
        answer = await asyncio.wait_for(reader.read(), READ_TIMEOUT_SECONDS)
        writer.close()
        assert status_of(answer) == 408

    run_with_server(scenario)


def test_a_handler_that_hangs_gets_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "HANDLER_TIMEOUT_SECONDS", 0.2)
    assert status_of(answer_to(b"GET /slow HTTP/1.1\r\n\r\n")) == 503


def test_the_request_head_parser_takes_the_path_without_the_query() -> None:
    assert parse_request_head(b"GET /metrics?x=1 HTTP/1.0\r\nAccept: */*") == ("GET", "/metrics")
