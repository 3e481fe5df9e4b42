"""Backends the integration suite runs against: local AWS servers over HTTP (moto, LocalStack), and the in-memory
backend for the tests marked ``memory`` (the runtime over ``worker.backends.memory``, no HTTP)."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from worker.dev.localaws import free_port


@dataclass
class Backend:
    """A running local AWS endpoint."""

    name: str
    endpoint_url: str
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def reset(self) -> None:
        """Forget all state (queues, tables) between tests, where the backend can."""
        if self.name == "moto":
            request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
            with urllib.request.urlopen(request, timeout=10):
                pass
        elif self.name == "localstack":
            _delete_queues_and_tables(self.endpoint_url)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def wait_http(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"backend process exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError as exc:
            last = exc
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s: {last}")


def start_memory() -> Backend:
    """The in-memory backend (``worker.backends.memory``): a broker of its own behind a ``memory://`` endpoint."""
    from tests.support.memory import new_endpoint

    return Backend("memory", new_endpoint())


def start_moto() -> Backend:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "worker.dev.localaws", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    endpoint = f"http://127.0.0.1:{port}"
    wait_http(f"{endpoint}/moto-api/", 30, process)
    return Backend("moto", endpoint, process)


REPO_ROOT = Path(__file__).resolve().parents[2]
LOCALSTACK_LAUNCHER = REPO_ROOT / "infra" / "localstack" / "run.py"
#: Use an already running LocalStack (e.g. a CI service container) instead of launching one on the host.
LOCALSTACK_URL_ENV = "LOCALSTACK_ENDPOINT_URL"


def start_localstack(ready_timeout_s: float = 180.0, *, options: Sequence[str] = ()) -> Backend:
    """LocalStack on a free loopback port via infra/localstack/run.py (or the one at $LOCALSTACK_ENDPOINT_URL).

    ``options`` are more launcher flags (e.g. ``--sqs-metrics-interval-s 5``); with them, an instance of its own
    is always launched. Raises RuntimeError with the launcher's reason when it cannot start: a missing backend
    fails the run.
    """
    external = os.environ.get(LOCALSTACK_URL_ENV)
    if external and not options:
        endpoint = external.rstrip("/")
        _await_localstack_health(endpoint, ready_timeout_s)
        return Backend("localstack", endpoint)
    port = free_port()
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            [
                sys.executable,
                str(LOCALSTACK_LAUNCHER),
                "--port",
                str(port),
                "--stop-timeout-s",
                "10",
                "--ready-timeout-s",
                str(ready_timeout_s),
                *options,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            env={**os.environ},
        )
        line = _read_line(process, ready_timeout_s + 30)
        if not line.startswith("ready "):
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
            errors.seek(0)
            reason = errors.read().decode("utf-8", "replace").strip() or f"no ready line, got {line!r}"
            raise RuntimeError(f"LocalStack backend did not start (run infra/localstack/setup.sh first?): {reason}")
    return Backend("localstack", line.split(" ", 1)[1], process)


def _read_line(process: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The first line the process prints, or "" at end of output or after ``timeout_s``."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return ""
    return process.stdout.readline().decode("utf-8", "replace").strip()


def _await_localstack_health(endpoint: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{endpoint}/_localstack/health", timeout=5) as response:
                services = json.load(response).get("services", {})
            if all(services.get(name) in ("available", "running") for name in ("sqs", "dynamodb")):
                return
            last = f"services {services}"
        except (OSError, ValueError) as exc:
            last = str(exc)
        time.sleep(0.5)
    raise RuntimeError(f"LocalStack at {endpoint} not healthy within {timeout_s} s: {last}")


def _delete_queues_and_tables(endpoint_url: str) -> None:
    import boto3

    session = boto3.session.Session()  # a fresh session: credentials (so the account) as the environment says now
    sqs = session.client("sqs", endpoint_url=endpoint_url)
    for page in sqs.get_paginator("list_queues").paginate():
        for url in page.get("QueueUrls", []):
            sqs.delete_queue(QueueUrl=url)
    dynamodb = session.client("dynamodb", endpoint_url=endpoint_url)
    for tables in dynamodb.get_paginator("list_tables").paginate():
        for table in tables.get("TableNames", []):
            dynamodb.delete_table(TableName=table)
