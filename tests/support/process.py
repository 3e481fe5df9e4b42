"""Running ``sqs-worker`` as a real process, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def worker_env(endpoint_url: str, **settings: str) -> dict[str, str]:
    # AWS_REGION alone (boto3 itself reads only AWS_DEFAULT_REGION): the worker must pass it on.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKER_") and k != "AWS_DEFAULT_REGION"}
    env.update(
        AWS_ENDPOINT_URL=endpoint_url,
        AWS_REGION="us-east-1",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        PYTHONPATH=str(ROOT),
        WORKER_POLL_WAIT_S="1",
        WORKER_METRICS="off",
        WORKER_HEALTH_FILE=str(Path(settings.pop("TMP", "/tmp")) / f"health-{os.getpid()}-{time.monotonic_ns()}"),
    )
    env.update(settings)
    return env


def cli(*args: str, env: dict[str, str], timeout_s: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.commands", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=ROOT,
        **kwargs,
    )


def start(*args: str, env: dict[str, str], stderr_path: Path) -> subprocess.Popen[bytes]:
    with stderr_path.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.commands", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=ROOT,
        )


def wait_until(condition: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll ``condition`` (another process's effect: no event to await across processes), bounded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def bootstrapped_queue(
    endpoint_url: str, tmp_path: Path, *, handlers: str, prefix: str, **settings: str
) -> tuple[dict[str, str], str]:
    """A new queue and DLQ made by ``sqs-worker bootstrap``, and the environment that runs ``handlers`` on it
    (effects in ``tmp_path/effects.txt``); returns that environment and the queue's URL."""
    import boto3

    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    env = worker_env(
        endpoint_url,
        WORKER_QUEUE=queue,
        WORKER_HANDLERS=handlers,
        TEST_EFFECTS_FILE=str(tmp_path / "effects.txt"),
        TMP=str(tmp_path),
        **settings,
    )
    result = cli("bootstrap", env=env)
    assert result.returncode == 0, result.stderr
    client = boto3.client("sqs", endpoint_url=endpoint_url, region_name="us-east-1")
    return env, client.get_queue_url(QueueName=queue)["QueueUrl"]
