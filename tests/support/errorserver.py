"""A tiny HTTP server that answers every AWS request with one error, as AWS words it (JSON or XML protocol).

moto accepts any credentials and grants every permission; this server stands in for an endpoint that refuses
credentials (``InvalidClientTokenId``) or access (``AccessDenied``), or answers an HTML error page.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Served:
    """A running error server: its URL and how many requests it answered."""

    url: str
    requests: int = 0


@dataclass(frozen=True)
class Answer:
    status: int
    code: str  # the AWS error code; "" for an HTML page
    message: str = "refused by the test server"


def _handler(answer: Answer, served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            served.requests += 1
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            json_protocol = "json" in (self.headers.get("Content-Type") or "")
            headers = {"x-amzn-RequestId": "test-request"}
            if not answer.code:
                body = f"<!doctype html><html><title>{answer.status} Oops</title><h1>Oops</h1>" + "<p>x</p>" * 200
                headers["Content-Type"] = "text/html"
            elif json_protocol:
                body = json.dumps({"__type": f"com.amazonaws.test#{answer.code}", "message": answer.message})
                headers["Content-Type"] = "application/x-amz-json-1.0"
                headers["x-amzn-query-error"] = f"{answer.code};Sender"
            else:
                body = (
                    "<ErrorResponse><Error><Type>Sender</Type>"
                    f"<Code>{answer.code}</Code><Message>{answer.message}</Message>"
                    "</Error><RequestId>test-request</RequestId></ErrorResponse>"
                )
                headers["Content-Type"] = "text/xml"
            data = body.encode("utf-8")
            self.send_response(answer.status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@contextmanager
def error_server(answer: Answer) -> Iterator[Served]:
    """An endpoint answering every request with ``answer``, for the duration of the block."""
    served = Served("")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(answer, served))
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
