"""The console's HTTP server (``dbos-async console``): uvicorn, answering requests too
large to parse with an error the client can read.

uvicorn's HTTP/1.1 parser (h11) gives up on a request line and headers over
``MAX_HEAD_BYTES``: uvicorn then answers 400 and closes at once, with the rest of the
request unread, so the system resets the connection and the client sees the reset, not the
answer. Here the answer says what was too long (414 for the URL, 431 for the headers) and
the connection reads and drops what the client still sends before it closes.
"""

from __future__ import annotations

import asyncio
import http

from dbos_async._extras import needs_extra

with needs_extra("console", __name__):
    import h11
    import uvicorn
    from starlette.types import ASGIApp
    from uvicorn.protocols.http.h11_impl import H11Protocol

from dbos_async.console.app import MAX_URL_BYTES

MAX_HEAD_BYTES = 16 * 1024
"""The request line and headers the parser reads at most (h11's default)."""
LINGER_SECONDS = 5.0
"""How long a refused connection reads the rest of its request before closing."""


class ConsoleHTTP(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with readable refusals of unparsable requests."""

    lingering: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self.lingering is None:
            super().data_received(data)
        # Else the rest of a refused request: dropped.

    def send_400_response(self, msg: str) -> None:
        """Called by uvicorn when h11 cannot parse the request."""
        head, _ = self.conn.trailing_data
        status, message = 400, msg
        if len(head) > MAX_HEAD_BYTES and b"\r\n" not in head:
            status, message = 414, f"The URL is over {MAX_URL_BYTES} bytes"
        elif len(head) > MAX_HEAD_BYTES:
            status, message = 431, f"The request's headers are over {MAX_HEAD_BYTES} bytes"
        body = message.encode()
        for event in (h11.Response(status_code=status, reason=http.HTTPStatus(status).phrase,
                                   headers=[(b"content-type", b"text/plain; charset=utf-8"),
                                            (b"content-length", str(len(body)).encode()),
                                            (b"connection", b"close")]),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        # Closed with unread data, the connection would be reset: read on (the client's
        # end of the request closes it) for a while instead.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.lingering = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lingering is not None:
            self.lingering.cancel()
        super().connection_lost(exc)


def console_server(app: ASGIApp, host: str, port: int) -> uvicorn.Server:
    """A uvicorn server of the console ``app`` on ``host:port``, with the refusals above."""
    return uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_level="warning", http=ConsoleHTTP,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES))
