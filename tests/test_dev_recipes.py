"""``sqs-worker dev`` demonstrates the recipes: its SMTP and webhook receivers print what they get, and the demo
report is ready in the embedded S3 (no account, no Docker)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.process import wait_until, worker_env

ROOT = Path(__file__).resolve().parents[1]


def test_dev_runs_the_three_recipes_against_local_receivers(tmp_path: Path) -> None:
    env = worker_env("http://127.0.0.1:9", TMP=str(tmp_path))
    log_path = tmp_path / "dev.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "worker.commands", "dev"], env=env, stdout=log, stderr=log, cwd=tmp_path
        )
    try:
        wait_until(lambda: "dev webhook receiver: demo-1 signature ok: {" in log_path.read_text(), 60, "the webhook")
        text = log_path.read_text()
        assert "demo-1 signature ok; answering 503 once to show a retry" in text  # retried after Retry-After
        assert "dev smtp receiver: mail to ada@example.com, subject 'Welcome, Ada', template welcome/1" in text
        endpoint = re.search(r"export AWS_ENDPOINT_URL=(\S+)", text)
        assert endpoint is not None, text
        shell = {
            **env,
            "AWS_ENDPOINT_URL": endpoint.group(1),
            "AWS_ACCESS_KEY_ID": "dev",
            "AWS_SECRET_ACCESS_KEY": "dev",
            "WORKER_IDEMPOTENCY_TABLE": "sqs-worker-dev-idempotency",
        }

        def report_ready() -> bool:
            result = subprocess.run(
                [sys.executable, "-m", "worker.commands", "status", "report-demo", "--json"],
                env=shell,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                cwd=ROOT,
            )
            return result.returncode == 0 and json.loads(result.stdout)["state"] == "succeeded"

        wait_until(report_ready, 60, "the demo report", interval_s=0.5)
        assert "mail.log" not in log_path.read_text()  # aiosmtpd's per-command lines are quieted
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=30)
    assert code == 0, log_path.read_text()
