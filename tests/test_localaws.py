"""The embedded local AWS of ``sqs-worker dev``."""

from __future__ import annotations

import logging
import socket

import pytest

from worker import ConfigError
from worker.dev.localaws import LocalAws


def test_a_taken_port_is_a_clear_error_not_a_hang() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            LocalAws(port=port).start()


def test_a_port_left_in_time_wait_is_free_again_at_once() -> None:
    """A dev server stopped a moment ago leaves TIME-WAIT connections on its port: the next one starts there."""
    with LocalAws() as first:
        port = first.port
        for _ in range(3):  # HTTP/1.0: the server closes each connection first, so its ends go to TIME-WAIT
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(b"GET /moto-api/data.json HTTP/1.0\r\nHost: local\r\n\r\n")
                answer = b""
                while chunk := client.recv(65536):
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 200") or answer.startswith(b"HTTP/1.0 200")
    with LocalAws(port=port) as second:
        assert second.port == port


def test_a_server_error_is_logged_as_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """Any other error of the embedded server (werkzeug's "Error on request" with a traceback) is one line."""
    LocalAws()  # installs the filter on the werkzeug logger
    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nKeyError: 'QueueUrl'"
    with caplog.at_level(logging.INFO, logger="werkzeug"):
        logging.getLogger("werkzeug").error("Error on request:\n%s", traceback)
    assert [record.getMessage() for record in caplog.records] == ["local AWS: error on request: KeyError: 'QueueUrl'"]
