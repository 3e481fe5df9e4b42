"""A reader that closes the pipe early (``sqs-worker ... | head -c 100``): the CLI stops quietly, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("argv", [["schema"], ["schedules", "list", "--file", "schedules.example.yaml"]])
def test_a_closed_stdout_exits_quietly(argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write meets EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import sys; from worker.commands.__main__ import main; sys.exit(main())", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            cwd=ROOT,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.stderr.decode() == ""  # no traceback, no "Exception ignored"
    assert proc.returncode == 141  # 128 + SIGPIPE, what `cat big | head` gives under `set -o pipefail`
