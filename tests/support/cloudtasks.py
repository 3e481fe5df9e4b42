"""Cloud Tasks for the tests: the ``gcloud-tasks-emulator`` (a local Cloud Tasks API over gRPC that dispatches
HTTP tasks), keys and tokens the test controls with a JWKS endpoint serving them, and ``serve-tasks`` in-process.

The emulator runs from its own virtualenv (``infra/cloudtasks/setup.sh`` makes it): it pins ``protobuf<5``, which
must not hold back ``google-cloud-tasks`` in uv.lock. The tests talk to it over gRPC with the project's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.harness import Recorder
from worker.backends.cloudtasks.deadletters import DeadLetterStore, StoredDeadLetter
from worker.backends.cloudtasks.server import serve_tasks
from worker.backends.cloudtasks.settings import CloudTasksSettings
from worker.dev.localaws import free_port
from worker.jobs import Registry
from worker.settings import WorkerSettings

PROJECT = "test-project"
LOCATION = "test-location"
SECRET = "a-shared-secret-for-tests"
#: Dispatches per task before the emulator itself gives up (its only retry setting); above the tests' max attempts.
EMULATOR_MAX_RETRIES = 6
#: The emulator's virtualenv (infra/cloudtasks/setup.sh), or $CLOUDTASKS_EMULATOR_VENV.
EMULATOR_VENV = Path(
    os.environ.get(
        "CLOUDTASKS_EMULATOR_VENV", Path(__file__).resolve().parents[2] / ".tools" / "cloudtasks-emulator-venv"
    )
)


@dataclass
class Emulator:
    """A running gcloud-tasks-emulator: its gRPC address and the process."""

    host: str
    process: subprocess.Popen[bytes] = field(repr=False)

    def client(self) -> Any:
        from worker.backends.cloudtasks.producer import tasks_client

        return tasks_client(CloudTasksSettings(emulator_host=self.host))

    def new_queue(self) -> str:
        """A fresh queue; returns its id."""
        queue_id = f"q-{uuid.uuid4().hex[:10]}"
        path = f"projects/{PROJECT}/locations/{LOCATION}/queues/{queue_id}"
        self.client().create_queue(parent=path.rsplit("/queues/", 1)[0], queue={"name": path})
        return queue_id

    def pause(self, queue_id: str) -> None:
        """Stop dispatching the queue's tasks (they stay listed)."""
        self.client().pause_queue(name=f"projects/{PROJECT}/locations/{LOCATION}/queues/{queue_id}")

    def tasks(self, queue_id: str) -> list[Any]:
        """The tasks the queue still holds (a task answered 2xx, or given up, is gone)."""
        path = f"projects/{PROJECT}/locations/{LOCATION}/queues/{queue_id}"
        return list(self.client().list_tasks(parent=path).tasks)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


def start_emulator(ready_timeout_s: float = 30.0, venv: Path = EMULATOR_VENV) -> Emulator:
    """The emulator on a free port; fails loudly (with its log) when it does not answer within ``ready_timeout_s``."""
    import grpc

    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"no Cloud Tasks emulator virtualenv at {venv}: run infra/cloudtasks/setup.sh")
    port = free_port()
    log = tempfile.TemporaryFile()  # noqa: SIM115 - the emulator's stderr, read back only when it fails to start
    command = [str(python), "-W", "ignore::FutureWarning", "-m", "gcloud_tasks_emulator", "start"]
    process = subprocess.Popen(
        [*command, "-p", str(port), "-q", "-r", str(EMULATOR_MAX_RETRIES)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=ready_timeout_s)
    except grpc.FutureTimeoutError:
        process.kill()
        process.wait(timeout=10)
        log.seek(0)
        tail = log.read().decode("utf-8", "replace").strip().splitlines()[-20:]
        raise RuntimeError(
            f"gcloud-tasks-emulator ({python}) did not answer on port {port} within {ready_timeout_s} s; "
            f"exit code {process.returncode}, its stderr:\n" + "\n".join(tail)
        ) from None
    finally:
        channel.close()
        log.close()
    return Emulator(f"127.0.0.1:{port}", process)


async def wait_until(condition: Any, timeout_s: float = 20.0, interval_s: float = 0.05) -> None:
    """Poll ``condition()`` (for state outside the event loop: the emulator's task list, a table)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)


# ----------------------------------------------------------------------------------------------- OIDC


class SigningKeys:
    """RSA keys the test controls, a JWKS endpoint serving the public ones, and Google-like ID tokens."""

    def __init__(self) -> None:
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = uuid.uuid4().hex
        self.fetches = 0
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key()))
        self.jwks = {"keys": [{**public, "kid": self.kid, "alg": "RS256", "use": "sig"}]}
        keys = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                keys.fetches += 1
                body = json.dumps(keys.jwks).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/oauth2/v3/certs"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def token(self, *, key: Any = None, kid: str | None = None, algorithm: str = "RS256", **claims: Any) -> str:
        now = int(time.time())
        body = {
            "iss": "https://accounts.google.com",
            "aud": "https://worker.example/tasks",
            "email": "tasks@test-project.iam.gserviceaccount.com",
            "email_verified": True,
            "iat": now,
            "exp": now + 3600,
            "sub": "1234567890",
        }
        body.update(claims)
        body = {name: value for name, value in body.items() if value is not None}
        signing_key = self.private if key is None else key
        return jwt.encode(body, signing_key, algorithm=algorithm, headers={"kid": kid or self.kid})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ----------------------------------------------------------------------------------------------- the server


@dataclass
class Serving:
    port: int
    recorder: Recorder
    stop: asyncio.Event
    task: asyncio.Task[None]
    settings: WorkerSettings
    cloudtasks: CloudTasksSettings

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/tasks"


def cloudtasks_settings(port: int, **overrides: Any) -> CloudTasksSettings:
    values: dict[str, Any] = {
        "project": PROJECT,
        "location": LOCATION,
        "url": f"http://127.0.0.1:{port}/tasks",
        "host": "127.0.0.1",
        "port": port,
        "max_attempts": 3,
        "shared_secret": SECRET,
        "dead_letter_write_s": 5.0,
        **overrides,
    }
    return CloudTasksSettings(**values)


@contextlib.asynccontextmanager
async def serving(
    registry: Registry,
    *,
    queue: str,
    dead_letter_table: str,
    tmp_path: Any,
    idempotency_table: str | None = None,
    concurrency: int = 4,
    shutdown_grace_s: float = 10.0,
    keys: Any = None,
    **cloudtasks: Any,
) -> AsyncIterator[Serving]:
    """``serve-tasks`` in this event loop (no signal handlers) until the block ends."""
    port = free_port()
    settings = WorkerSettings(
        queue=queue,
        backend="cloudtasks",
        idempotency_table=idempotency_table,
        concurrency=concurrency,
        shutdown_grace_s=shutdown_grace_s,
        metrics="off",
        health_file=str(tmp_path / "health"),
    )
    ct = cloudtasks_settings(port, dead_letter_table=dead_letter_table, **cloudtasks)
    recorder = Recorder()
    stop = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve_tasks(
            settings,
            registry,
            cloudtasks=ct,
            stop=stop,
            started=started,
            signals=False,
            keys=keys,
            extra_observers=[recorder],
        )
    )
    waited: set[asyncio.Future[Any]] = {task, started}
    done, _ = await asyncio.wait(waited, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
    assert started.done(), "serve-tasks did not start within 30 s"
    running = Serving(started.result(), recorder, stop, task, settings, ct)
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=shutdown_grace_s + 30)


@dataclass
class RefusingServer:
    """``serve-tasks`` whose one job, ``refuse``, fails for good: each task posted to it becomes a dead letter."""

    server: Serving
    table: str
    queue: str


@contextlib.asynccontextmanager
async def refusing_server(endpoint_url: str, emulator: Emulator, tmp_path: Any) -> AsyncIterator[RefusingServer]:
    """A fresh dead-letter table and emulator queue, and ``serve-tasks`` refusing every ``refuse`` job, until the
    block ends (``AWS_ENDPOINT_URL`` must name ``endpoint_url``: the table lives there)."""
    from worker.errors import PermanentError

    table = await make_dead_letter_table(endpoint_url)
    queue = emulator.new_queue()
    registry = Registry()

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        raise PermanentError("no such account")

    async with serving(registry, queue=queue, dead_letter_table=table, tmp_path=tmp_path) as server:
        yield RefusingServer(server, table, queue)


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float = 30.0) -> tuple[int, dict[str, str], Any]:
    """POST and return (status, headers, JSON body), whatever the status (blocking: call via asyncio.to_thread)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return (
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                json.loads(response.read() or b"null"),
            )
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            document = json.loads(text or b"null")
        except ValueError:
            document = text.decode("utf-8", "replace")
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, document


def task_headers(name: str = "t1", *, retry_count: int = 0, secret: str | None = SECRET) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "X-CloudTasks-QueueName": "q",
        "X-CloudTasks-TaskName": name,
        "X-CloudTasks-TaskRetryCount": str(retry_count),
        "X-CloudTasks-TaskExecutionCount": str(retry_count),
    }
    if secret is not None:
        headers["X-Worker-Secret"] = secret
    return headers


async def dead_letters(endpoint_url: str, table: str, queue: str) -> list[StoredDeadLetter]:
    from aiobotocore.session import get_session

    async with get_session().create_client("dynamodb", endpoint_url=endpoint_url, region_name="us-east-1") as client:
        return await DeadLetterStore(client, table, queue).list(limit=1000)


async def make_dead_letter_table(endpoint_url: str) -> str:
    from aiobotocore.session import get_session

    from worker.backends.cloudtasks.deadletters import create_dead_letter_table

    name = f"dead-letters-{uuid.uuid4().hex[:8]}"
    async with get_session().create_client("dynamodb", endpoint_url=endpoint_url, region_name="us-east-1") as client:
        await create_dead_letter_table(client, name)
    return name


@contextlib.contextmanager
def signing_keys() -> Iterator[SigningKeys]:
    keys = SigningKeys()
    try:
        yield keys
    finally:
        keys.close()
