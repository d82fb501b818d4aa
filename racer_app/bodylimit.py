"""ASGI middleware that refuses an HTTP request body over a size limit before anything reads
it: a declared Content-Length over the limit gets 413 at once, and a streamed body is cut off
(413) as soon as it passes the limit. Without it, FastAPI reads and JSON-parses the whole body
(50 MB of prompt cost 50-100 MB of memory) before the app's own length check runs.
"""
from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from starlette.exceptions import HTTPException

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class _TooLarge(HTTPException):
    """Raised from the body stream: FastAPI passes an HTTPException through its body parsing
    (anything else it turns into a 400), so the client gets the 413 and its message."""


class BodyLimit:
    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)

    def _message(self) -> bytes:
        mb = self.max_bytes / 2**20
        return json.dumps({"detail": f"The request is too large: this server takes request bodies of up to "
                                     f"{mb:.3g} MB."}).encode()

    async def _refuse(self, send: Send) -> None:
        body = self._message()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers") or []:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
        seen = 0
        started = False

        async def counted_receive() -> dict[str, Any]:
            nonlocal seen
            msg = await receive()
            if msg.get("type") == "http.request":
                seen += len(msg.get("body") or b"")
                if seen > self.max_bytes:
                    raise _TooLarge(413, json.loads(self._message())["detail"])
            return msg

        async def watched_send(msg: dict[str, Any]) -> None:
            nonlocal started
            if msg.get("type") == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, counted_receive, watched_send)
        except _TooLarge:
            if not started:
                await self._refuse(send)
