"""``sqs-worker dev``'s banner names the demo's report only when the demo jobs are sent."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.process import wait_until, worker_env


@pytest.mark.parametrize(("argv", "hinted"), [(["--no-demo"], False), ([], True)])
def test_demo_hints_only_with_the_demo(tmp_path: Path, argv: list[str], hinted: bool) -> None:
    env = worker_env("http://127.0.0.1:9", TMP=str(tmp_path))
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.commands", "dev", *argv], env=env, stdout=log, stderr=log, cwd=tmp_path
        )
    try:
        wait_until(lambda: "Stop with Ctrl-C." in log_path.read_text(), 60, "the dev banner")
        text = log_path.read_text()
        assert "recipes: SMTP receiver" in text, text  # the recipes run here (the [dev] extra is installed)
        assert ("sqs-worker status report-demo" in text) is hinted, text
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
