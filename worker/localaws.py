"""An embedded local AWS for development and tests: a moto server on a loopback port, no account, no Docker.

``sqs-worker dev`` starts one in-process; tests run ``python -m worker.localaws --port N`` as a separate
process. Item writes to DynamoDB are made to take turns, as real DynamoDB serialises writes to an item
(moto's conditional writes are check-then-write without a lock).
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

_WRITE_METHODS = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
_lock_installed = False


def serialise_dynamodb_writes() -> None:
    """Wrap moto's DynamoDB item writes in one lock (idempotent)."""
    global _lock_installed
    if _lock_installed:
        return
    from moto.dynamodb.models import DynamoDBBackend

    lock = threading.RLock()
    for name in _WRITE_METHODS:
        original = getattr(DynamoDBBackend, name, None)
        if original is None:
            continue
        setattr(DynamoDBBackend, name, _locked(original, lock))
    _lock_installed = True


def _locked(method: Callable[..., Any], lock: threading.RLock) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return wrapper


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class LocalAws:
    """A moto server running in a thread of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as exc:  # pragma: no cover - depends on the install
            from worker.errors import ConfigError

            raise ConfigError("the embedded local AWS needs moto: pip install 'sqs-worker[dev]'") from exc
        serialise_dynamodb_writes()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.host = host
        self.port = port or free_port(host)
        self._server = ThreadedMotoServer(ip_address=host, port=self.port, verbose=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LocalAws:
        # The server's own start waits without a bound for a server that failed to bind: check the port first.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                from worker.errors import ConfigError

                raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from exc
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> LocalAws:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a moto server (local AWS) until SIGTERM or SIGINT.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with LocalAws(args.host, args.port) as aws:
        print(f"local AWS listening on {aws.endpoint_url}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
