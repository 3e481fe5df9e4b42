#!/usr/bin/env python3
"""Run LocalStack on this host, without Docker and offline, until SIGTERM or SIGINT.

LocalStack runs from its own pinned virtualenv (``infra/localstack/setup.sh`` makes it) with the services the
worker uses, DynamoDB served by the ``dynamodb:moto`` provider plugin, state in a temporary directory. The
launcher waits for LocalStack's "Ready." line, checks ``/_localstack/health``, warms SQS and DynamoDB up
(their first call loads the provider and takes seconds), then prints one line ``ready <endpoint URL>`` on
stdout. On SIGTERM it stops LocalStack (SIGTERM, then SIGKILL after ``--stop-timeout-s``).

Standard library only: any Python 3.11 may run it, e.g. ``python infra/localstack/run.py --port 4566``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO_ROOT / ".tools" / "localstack-venv"
SERVICES = "sqs,dynamodb,s3,events,scheduler,cloudwatch,logs,sts"
READY_LINE = "Ready."
LOG_TAIL_LINES = 60
_UP = frozenset({"available", "running"})

#: One cheap read per service whose first call is slow (it loads the provider); JSON protocol for both.
WARM_UP_CALLS = {
    "sqs": ("AmazonSQS.ListQueues", "application/x-amz-json-1.0"),
    "dynamodb": ("DynamoDB_20120810.ListTables", "application/x-amz-json-1.0"),
}


class LaunchError(RuntimeError):
    """LocalStack could not be started; the message says why and carries the tail of its log."""


def localstack_env(
    host: str, port: int, filesystem_root: Path, *, services: str = SERVICES, sqs_metrics_interval_s: int | None = None
) -> dict[str, str]:
    """The environment LocalStack runs with: loopback only, no DNS, no telemetry, no downloads.

    SQS publishes no AWS/SQS metrics to CloudWatch (about 3x faster SQS) unless ``sqs_metrics_interval_s`` is
    given: then it publishes the queue depths (ApproximateNumberOfMessagesVisible, ...) that often.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
    sqs_metrics = {"SQS_DISABLE_CLOUDWATCH_METRICS": "1"}
    if sqs_metrics_interval_s is not None:
        sqs_metrics = {
            "SQS_DISABLE_CLOUDWATCH_METRICS": "0",
            "SQS_CLOUDWATCH_METRICS_REPORT_INTERVAL": str(sqs_metrics_interval_s),
        }
    env.update(
        {
            "GATEWAY_LISTEN": f"{host}:{port}",
            "SERVICES": services,
            "PROVIDER_OVERRIDE_DYNAMODB": "moto",
            "DNS_ADDRESS": "0",
            "SKIP_SSL_CERT_DOWNLOAD": "1",
            "LOCALSTACK_TELEMETRY": "0",
            "DISABLE_EVENTS": "1",
            **sqs_metrics,
            "FILESYSTEM_ROOT": str(filesystem_root),
            # This machine (and many CI runners) looks like a container (/.dockerenv): LocalStack would then
            # ignore FILESYSTEM_ROOT and share /var/lib/localstack and /tmp/localstack with every instance.
            "OVERRIDE_IN_DOCKER": "0",
            "PERSISTENCE": "0",
            "LS_LOG": env.get("LS_LOG", "warn"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGTERM LocalStack if this launcher dies without stopping it (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


class LocalStack:
    """A LocalStack process started by this launcher; ``stop()`` ends it and removes its state."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 4566,
        venv: Path = DEFAULT_VENV,
        log_path: Path | None = None,
        extra_services: tuple[str, ...] = (),
        sqs_metrics_interval_s: int | None = None,
    ) -> None:
        self.host = host
        self.services = ",".join([SERVICES, *extra_services])
        self.sqs_metrics_interval_s = sqs_metrics_interval_s
        self.port = port
        self.python = venv / "bin" / "python"
        self.state_dir: Path | None = None  # a fresh temporary directory from start() until stop()
        self.log_path = log_path
        self._tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._ready = threading.Event()
        self._output_done = threading.Event()
        self._settled = threading.Event()
        self._process: subprocess.Popen[str] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def process(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise LaunchError("LocalStack was not started")
        return self._process

    def start(self, *, ready_timeout_s: float) -> LocalStack:
        """Start LocalStack and return once it answers and SQS and DynamoDB are warm; LaunchError if not."""
        if not self.python.exists():
            raise LaunchError(f"no LocalStack virtualenv at {self.python.parent.parent}: run infra/localstack/setup.sh")
        self.state_dir = Path(tempfile.mkdtemp(prefix="sqs-worker-localstack-"))
        log_path = self.log_path = self.log_path or self.state_dir / "localstack.log"
        filesystem_root = self.state_dir / "filesystem"
        try:
            filesystem_root.mkdir()
            self._process = subprocess.Popen(  # noqa: S603 - our own pinned interpreter, fixed arguments
                [str(self.python), "-m", "localstack.runtime.main"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=localstack_env(
                    self.host,
                    self.port,
                    filesystem_root,
                    services=self.services,
                    sqs_metrics_interval_s=self.sqs_metrics_interval_s,
                ),
                cwd=self.state_dir,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
            threading.Thread(target=self._copy_output, args=(log_path,), name="localstack-log", daemon=True).start()
            self._await_ready(ready_timeout_s)
            self._check_health()
            for service in WARM_UP_CALLS:
                self._warm_up(service)
        except BaseException:
            self.stop()
            raise
        return self

    def _copy_output(self, log_path: Path) -> None:
        """Drain LocalStack's output into the log file; flag the ready line; flag end of output."""
        stream: IO[str] | None = self.process.stdout
        assert stream is not None
        try:
            with log_path.open("a", encoding="utf-8") as log:
                for line in stream:
                    log.write(line)
                    log.flush()
                    self._tail.append(line.rstrip("\n"))
                    if line.strip() == READY_LINE:
                        self._ready.set()
                        self._settled.set()
        finally:
            self._output_done.set()
            self._settled.set()

    def _await_ready(self, timeout_s: float) -> None:
        # The output thread sets _settled on the ready line or at the end of the output (LocalStack exited).
        self._settled.wait(timeout_s)
        if self._ready.is_set():
            return
        code = self.process.poll()
        reason = f"exited with code {code}" if code is not None else f"was not ready within {timeout_s:g} s"
        raise LaunchError(f"LocalStack {reason}; last lines of its log ({self.log_path}):\n{self.log_tail()}")

    def _check_health(self) -> None:
        try:
            with urllib.request.urlopen(f"{self.endpoint_url}/_localstack/health", timeout=10) as response:  # noqa: S310
                services: dict[str, str] = json.load(response).get("services", {})
        except (OSError, ValueError) as exc:
            raise LaunchError(f"LocalStack said ready but /_localstack/health failed: {exc}") from exc
        unusable = {name: services.get(name) for name in self.services.split(",") if services.get(name) not in _UP}
        if unusable:
            raise LaunchError(f"LocalStack services not available: {unusable}\n{self.log_tail()}")

    def _warm_up(self, service: str) -> None:
        target, content_type = WARM_UP_CALLS[service]
        request = urllib.request.Request(  # noqa: S310 - loopback URL we built
            f"{self.endpoint_url}/",
            data=b"{}",
            method="POST",
            headers={
                "Content-Type": content_type,
                "X-Amz-Target": target,
                # LocalStack routes on the credential scope and does not check the signature.
                "Authorization": (
                    f"AWS4-HMAC-SHA256 Credential=test/20250101/us-east-1/{service}/aws4_request, "
                    "SignedHeaders=content-type;host;x-amz-target, Signature=0"
                ),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=120):  # noqa: S310 - loopback URL we built
                pass
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:500]
            raise LaunchError(f"warm-up call {target} failed with HTTP {exc.code}: {body}\n{self.log_tail()}") from exc
        except OSError as exc:
            raise LaunchError(f"warm-up call {target} failed: {exc}\n{self.log_tail()}") from exc

    def log_tail(self) -> str:
        return "\n".join(self._tail)

    def wait(self) -> int:
        return self.process.wait()

    def stop(self, *, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; then remove the state directory."""
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if process is not None:
            self._output_done.wait(timeout=5)
        if self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self.state_dir = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=4566, help="port to listen on (default: 4566)")
    parser.add_argument(
        "--venv",
        type=Path,
        default=Path(os.environ.get("LOCALSTACK_VENV", DEFAULT_VENV)),
        help="LocalStack's virtualenv (default: $LOCALSTACK_VENV or .tools/localstack-venv)",
    )
    parser.add_argument("--log-file", type=Path, help="append LocalStack's output here (default: its state dir)")
    parser.add_argument("--ready-timeout-s", type=float, default=120.0, help="give up starting after this long")
    parser.add_argument("--stop-timeout-s", type=float, default=20.0, help="SIGKILL if not stopped after this long")
    parser.add_argument(
        "--extra-services", default="", help=f"comma-separated services to run besides {SERVICES} (e.g. sns,iam)"
    )
    parser.add_argument(
        "--sqs-metrics-interval-s",
        type=int,
        default=None,
        help="publish the AWS/SQS queue metrics to CloudWatch this often (default: off, SQS is about 3x faster)",
    )
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    localstack = LocalStack(
        host=args.host,
        port=args.port,
        venv=args.venv,
        log_path=args.log_file,
        extra_services=tuple(name for name in args.extra_services.split(",") if name),
        sqs_metrics_interval_s=args.sqs_metrics_interval_s,
    )
    try:
        localstack.start(ready_timeout_s=args.ready_timeout_s)
    except LaunchError as exc:
        print(f"localstack launcher: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"ready {localstack.endpoint_url}", flush=True)

    # Wake on a signal, or when LocalStack exits by itself.
    def _watch() -> None:
        localstack.wait()
        stop.set()

    threading.Thread(target=_watch, name="localstack-watch", daemon=True).start()
    stop.wait()
    code = localstack.process.poll()
    localstack.stop(timeout_s=args.stop_timeout_s)
    if code is not None:
        print(
            f"localstack launcher: LocalStack exited by itself with code {code}:\n{localstack.log_tail()}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
