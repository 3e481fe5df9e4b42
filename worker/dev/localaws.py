"""An embedded local AWS for development and tests: a moto server on a loopback port, no account, no Docker.

``sqs-worker dev`` starts one in-process; tests run ``python -m worker.dev.localaws --port N`` as a separate
process. Item writes to DynamoDB are made to take turns, as real DynamoDB serialises writes to an item
(moto's conditional writes are check-then-write without a lock). An action moto lacks (StartMessageMoveTask)
answers 501 UnsupportedOperation, which botocore does not retry, instead of a 500 page (retried, and logged
as a 45-line traceback per try); any other error of the server is logged as one line.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import signal
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from werkzeug.serving import BaseWSGIServer

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


def _not_implemented(exc: NotImplementedError) -> Any:
    from flask import Response

    body = json.dumps({"__type": "UnsupportedOperation", "message": f"{exc} (local AWS: moto)"})
    return Response(body, status=501, content_type="application/x-amz-json-1.0")


def backend_app(service: Any) -> Any:
    """moto's app for one service, answering an action moto lacks with 501 UnsupportedOperation."""
    from moto.moto_server.werkzeug_app import create_backend_app

    app = create_backend_app(service)
    app.register_error_handler(NotImplementedError, _not_implemented)
    return app


class _OneLine(logging.Filter):
    """werkzeug's "Error on request" records carry a whole traceback: keep its last line (the error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            lines = record.getMessage().strip().splitlines()
            record.msg, record.args = "local AWS: error on request: %s", (lines[-1] if lines else "",)
            record.exc_info = record.exc_text = None
        return True


def quiet_request_errors() -> None:
    """The server's request log: errors as one line each, through the process's own logging (idempotent)."""
    logger = logging.getLogger("werkzeug")
    logger.setLevel(logging.ERROR)
    if not any(isinstance(f, _OneLine) for f in logger.filters):
        logger.addFilter(_OneLine())
    if not logger.handlers:  # else werkzeug adds its own stream handler (a second copy of each line)
        logger.addHandler(logging.NullHandler())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class LocalAws:
    """A moto server running in a thread of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        try:
            import moto.server  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the install
            from worker.errors import ConfigError

            raise ConfigError("the embedded local AWS needs moto: pip install 'sqs-worker[dev]'") from exc
        serialise_dynamodb_writes()
        quiet_request_errors()
        self.host = host
        self.port = port or free_port(host)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LocalAws:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler
        from werkzeug.serving import make_server

        from worker.errors import ConfigError

        # werkzeug prints and exits when it cannot bind: check the port first, with SO_REUSEADDR as werkzeug's
        # server binds (a port whose last server just stopped, only TIME-WAIT connections left, is free; a port
        # another socket listens on is not).
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.host, self.port))
            except OSError as exc:
                raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from exc
        try:
            self._server = make_server(
                self.host,
                self.port,
                DomainDispatcherApplication(backend_app),
                threaded=True,
                request_handler=MotoRequestHandler,
            )
        except SystemExit as exc:  # taken between the check and the bind
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: address already in use") from exc
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-aws", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()

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
