"""The embedded local AWS of ``sqs-worker dev``."""

from __future__ import annotations

import socket

import pytest

from worker import ConfigError
from worker.localaws import LocalAws


def test_a_taken_port_is_a_clear_error_not_a_hang() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            LocalAws(port=port).start()
