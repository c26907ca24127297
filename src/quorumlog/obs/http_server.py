"""A small HTTP/1.1 server on the node's event loop, for `/metrics`, `/health` and the
dashboard: GET (and HEAD) only, one request per connection, no framework.

Everything is bounded: the request line and headers together (`HEADER_BYTES_MAX`), the
time a client has to send them (`REQUEST_TIMEOUT_SECONDS`), the time a handler has to
answer (`HANDLER_TIMEOUT_SECONDS`), the connections served at once. Bad input gets a
typed answer and the connection is closed: 400 (a malformed request line or header),
404 (no such path), 405 (not GET or HEAD), 408 (too slow), 431 (headers too large),
503 (too many connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus

import msgspec

HEADER_BYTES_MAX = 16 * 1024
REQUEST_TIMEOUT_SECONDS = 10.0
HANDLER_TIMEOUT_SECONDS = 10.0
WRITE_TIMEOUT_SECONDS = 10.0
CONNECTIONS_MAX = 64
SERVER_NAME = "quorumlog"
ALLOW_HEADER = "Allow: GET, HEAD\r\n"

log = logging.getLogger("quorumlog.http")


class Response(msgspec.Struct, frozen=True):
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def json_response(value: object, status: int = 200) -> Response:
    return Response(status, json.dumps(value).encode(), "application/json")


def error_response(status: HTTPStatus, detail: str) -> Response:
    return Response(int(status), f"{status.value} {status.phrase}: {detail}\n".encode())


Handler = Callable[[], Awaitable[Response]]


class BadRequestError(Exception):
    """The request could not be read: answered with `response`, then closed."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.body.decode(errors="replace"))
        self.response = response


def parse_request_head(head: bytes) -> tuple[str, str]:
    """(method, path) of a request head (the request line and headers, up to the blank
    line); BadRequestError for anything that is not HTTP/1.x."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError as error:
        raise BadRequestError(
            error_response(HTTPStatus.BAD_REQUEST, "non-ASCII request head")
        ) from error
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
        raise BadRequestError(error_response(HTTPStatus.BAD_REQUEST, "malformed request line"))
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequestError(
            error_response(HTTPStatus.BAD_REQUEST, f"unsupported version {version!r}")
        )
    for line in lines[1:]:
        if line and (":" not in line or line[0] in " \t"):
            raise BadRequestError(error_response(HTTPStatus.BAD_REQUEST, "malformed header"))
    path = target.split("?", 1)[0]
    return method, path


def encode_response(response: Response, head_only: bool) -> bytes:
    status = HTTPStatus(response.status)
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        f"Server: {SERVER_NAME}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        f"{ALLOW_HEADER if status is HTTPStatus.METHOD_NOT_ALLOWED else ''}"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii")
    return head if head_only else head + response.body


class HttpServer:
    """Serves `routes` (path → handler) on `host:port` (0: any free port)."""

    def __init__(self, routes: Mapping[str, Handler]) -> None:
        self.routes = dict(routes)
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(
            self.serve_connection, host, port, limit=HEADER_BYTES_MAX
        )
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        for task in list(self.connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.server is not None:
            await self.server.wait_closed()

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
        try:
            if len(self.connections) > CONNECTIONS_MAX:
                response = error_response(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections")
                head_only = False
            else:
                response, head_only = await self.answer(reader)
            writer.write(encode_response(response, head_only))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_SECONDS)
        except (ConnectionError, TimeoutError):
            pass  # the client went away or stopped reading: nothing to tell it
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_SECONDS)
            if task is not None:
                self.connections.discard(task)

    async def answer(self, reader: asyncio.StreamReader) -> tuple[Response, bool]:
        """The response to the one request on this connection, and whether to send only
        its head (HEAD)."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_SECONDS)
            method, path = parse_request_head(head[:-4])
        except asyncio.LimitOverrunError:
            return error_response(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                f"the request head is over {HEADER_BYTES_MAX} bytes",
            ), False
        except asyncio.IncompleteReadError:
            return error_response(HTTPStatus.BAD_REQUEST, "incomplete request"), False
        except TimeoutError:
            return error_response(HTTPStatus.REQUEST_TIMEOUT, "request head too slow"), False
        except BadRequestError as error:
            return error.response, False
        head_only = method == "HEAD"
        if method not in ("GET", "HEAD"):
            return error_response(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not GET"), False
        handler = self.routes.get(path)
        if handler is None:
            return error_response(HTTPStatus.NOT_FOUND, f"no page at {path}"), head_only
        try:
            return await asyncio.wait_for(handler(), HANDLER_TIMEOUT_SECONDS), head_only
        except TimeoutError:
            return error_response(HTTPStatus.SERVICE_UNAVAILABLE, "the answer took too long"), (
                head_only
            )
