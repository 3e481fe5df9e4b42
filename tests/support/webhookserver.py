"""A local HTTP receiver that answers as a test scripts it (status, headers, delay) and records every request."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # answer this late (longer than the client's timeout: a timeout)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """The running server: its URL, the replies still scripted (then 200), and what it received."""

    url: str = ""
    script: list[Reply] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self) -> Reply:
        with self.lock:
            return self.script.pop(0) if self.script else Reply()


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            reply = receiver.next_reply()
            with receiver.lock:
                receiver.received.append(Received(self.path, dict(self.headers.items()), body, time.time()))
            if reply.delay_s:
                time.sleep(reply.delay_s)  # the server's own thread: a slow receiver
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@contextmanager
def webhook_receiver(*script: Reply) -> Iterator[Receiver]:
    receiver = Receiver(script=list(script))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
