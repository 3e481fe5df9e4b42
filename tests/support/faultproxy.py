"""A fault-injecting HTTP proxy on loopback in front of a local AWS endpoint.

Each request draws its fate from one seeded RNG, in arrival order, so a run's mix of faults is repeatable:

- ``error``: answered at once with HTTP 500 and an AWS-style ``InternalError`` body (JSON or query protocol, as the
  request spoke), never forwarded;
- ``drop_before``: the connection is closed before the request is forwarded (nothing happened upstream);
- ``drop_after``: the request is forwarded and the upstream answers, then the connection is closed before the
  answer reaches the client: the dangerous case (a ReceiveMessage's messages are claimed but nobody holds them);
- ``delay``: forwarded after ``delay_s``;
- ``ok``: forwarded as is.

Requests are forwarded over kept-alive upstream connections, one per client connection (as in
benchmarks/countproxy.py). ``FaultProxy(upstream, rates=NO_FAULTS)`` is a plain proxy with the same overhead, for a
fault-free baseline.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from benchmarks.countproxy import HOP_BY_HOP, action_of

UPSTREAM_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FaultRates:
    """The share of requests that get each fault; the rest pass."""

    error: float = 0.0
    drop_before: float = 0.0
    drop_after: float = 0.0
    delay: float = 0.0
    delay_s: float = 2.0

    def draw(self, rng: random.Random) -> str:
        roll = rng.random()
        for kind, share in (
            ("error", self.error),
            ("drop_before", self.drop_before),
            ("drop_after", self.drop_after),
            ("delay", self.delay),
        ):
            if roll < share:
                return kind
            roll -= share
        return "ok"


NO_FAULTS = FaultRates()
#: The mix of issue 9 item 6: 10% HTTP 500, 5% dropped connections (half before, half after the upstream
#: answered), 5% delayed by 2 s.
ISSUE_MIX = FaultRates(error=0.10, drop_before=0.025, drop_after=0.025, delay=0.05, delay_s=2.0)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: FaultProxy

    def handle_error(self, request: object, client_address: object) -> None:
        return None  # a client hanging up (a worker stopping, a dropped connection) is part of the game


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = -1
    server: _Server
    upstream: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: object) -> None:
        return None

    def do_POST(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def _handle(self) -> None:
        proxy = self.server.proxy
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        lowered = {k.lower(): v for k, v in headers.items()}
        action = action_of(lowered, body, self.path)
        fault = proxy.draw(action)
        if fault == "error":
            self._answer_error(json_protocol="json" in lowered.get("content-type", ""))
            return
        if fault == "drop_before":
            self._drop()
            return
        if fault == "delay":
            time.sleep(proxy.rates.delay_s)  # this connection's thread: the fault itself
        try:
            status, reason, response_headers, data = self._exchange(body, headers)
        except (http.client.HTTPException, OSError):
            self.send_error(502, "upstream failed")
            return
        if fault == "drop_after":
            self._drop()
            return
        self.send_response(status, reason)
        for key, value in response_headers:
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _answer_error(self, *, json_protocol: bool) -> None:
        message = "We encountered an internal error. Please try again."
        if json_protocol:
            data = json.dumps({"__type": "com.amazon.coral.service#InternalError", "message": message}).encode()
            content_type = "application/x-amz-json-1.0"
        else:
            data = (
                "<ErrorResponse><Error><Type>Receiver</Type><Code>InternalError</Code>"
                f"<Message>{message}</Message></Error><RequestId>fault-proxy</RequestId></ErrorResponse>"
            ).encode()
            content_type = "text/xml"
        self.send_response(500, "Internal Server Error")
        self.send_header("Content-Type", content_type)
        self.send_header("x-amzn-query-error", "InternalError;Receiver")
        self.send_header("x-amzn-RequestId", "fault-proxy")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _drop(self) -> None:
        """Close the client's connection without an answer."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _connect(self) -> http.client.HTTPConnection:
        proxy = self.server.proxy
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=UPSTREAM_TIMEOUT_S)
        upstream.connect()
        assert upstream.sock is not None
        upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return upstream

    def _exchange(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, list[tuple[str, str]], bytes]:
        for attempt in (1, 2):  # a kept-alive upstream connection may have been closed: reconnect once
            if self.upstream is None:
                self.upstream = self._connect()
            try:
                self.upstream.request(self.command, self.path, body=body, headers=headers)
                response = self.upstream.getresponse()
                data = response.read()
                return response.status, response.reason, response.getheaders(), data
            except (http.client.HTTPException, OSError):
                self.upstream.close()
                self.upstream = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def finish(self) -> None:
        super().finish()
        if self.upstream is not None:
            self.upstream.close()


class FaultProxy:
    """``start()`` it, point clients at ``endpoint_url``, read ``faults``; ``stop()`` in a finally."""

    def __init__(self, upstream_url: str, *, rates: FaultRates, seed: int = 0) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"plain http upstream expected, got {upstream_url!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.rates = rates
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        #: Requests by (action, fate), e.g. ("ReceiveMessage", "drop_after").
        self.faults: Counter[tuple[str, str]] = Counter()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def draw(self, action: str) -> str:
        with self._lock:
            fate = self.rates.draw(self._rng)
            self.faults[(action, fate)] += 1
            return fate

    def by_fate(self) -> Counter[str]:
        with self._lock:
            totals: Counter[str] = Counter()
            for (_, fate), count in self.faults.items():
                totals[fate] += count
            return totals

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
