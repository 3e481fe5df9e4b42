"""Local AWS backends the integration suite runs against, each a real server over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from worker.localaws import free_port


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
            with urllib.request.urlopen(request, timeout=10):  # noqa: S310 - loopback URL we built
                pass

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
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback URL we built
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError as exc:
            last = exc
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s: {last}")


def start_moto() -> Backend:
    port = free_port()
    process = subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-m", "worker.localaws", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    endpoint = f"http://127.0.0.1:{port}"
    wait_http(f"{endpoint}/moto-api/", 30, process)
    return Backend("moto", endpoint, process)
