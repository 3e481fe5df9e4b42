from __future__ import annotations

import io
import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from tests.support.backends import Backend, start_localstack, start_memory, start_moto
from tests.support.harness import make_queues
from tests.support.idempotency import dynamodb_client
from tests.support.logs import root_logging_restored
from worker.observability.logs import configure_logging
from worker.ops.bootstrap import Created
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

    from tests.support.cloudtasks import Emulator

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_REGION", "us-east-1")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
for _name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
    os.environ.pop(_name, None)

#: Every backend the integration suite runs on; SQS_WORKER_TEST_BACKENDS=moto narrows a local run (never in CI).
#: ``memory`` runs only the tests marked ``@pytest.mark.memory`` (those that need no HTTP endpoint).
BACKENDS = os.environ.get("SQS_WORKER_TEST_BACKENDS", "moto,localstack,memory").split(",")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test that uses a backend runs on each of BACKENDS; on memory only when marked ``memory``."""
    if "backend" in metafunc.fixturenames:
        marked = metafunc.definition.get_closest_marker("memory") is not None
        names = [name for name in BACKENDS if name != "memory" or marked]
        metafunc.parametrize("backend", names, indirect=True)


@pytest.fixture(scope="session")
def moto_backend() -> Iterator[Backend]:
    backend = start_moto()
    yield backend
    backend.stop()


@pytest.fixture(scope="session")
def localstack_backend() -> Iterator[Backend]:
    """LocalStack on the host (infra/localstack/run.py), started once; fails loudly when it cannot start."""
    backend = start_localstack()
    yield backend
    backend.stop()


@pytest.fixture(scope="session")
def memory_backend() -> Backend:
    return start_memory()


@pytest.fixture(scope="session")
def tasks_emulator() -> Iterator[Emulator]:
    """The gcloud-tasks-emulator (a local Cloud Tasks API), started once; each test makes its own queue."""
    from tests.support.cloudtasks import start_emulator

    emulator = start_emulator()
    yield emulator
    emulator.stop()


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each backend the integration suite runs against, started once per session (see pytest_generate_tests)."""
    started: Backend = request.getfixturevalue(f"{request.param}_backend")
    return started


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The commands configure logging on the root logger; undo it after the test."""
    with root_logging_restored():
        yield


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    """Route all logging through configure_logging into a buffer; restore the root logger afterwards."""
    stream = io.StringIO()
    with root_logging_restored():
        configure_logging(WorkerSettings(queue="q", log_level="DEBUG"), stream=stream)
        yield stream
    logging.getLogger("worker").setLevel(logging.NOTSET)


@pytest.fixture
def queues(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Created:
    """A queue and its DLQ on the backend, named by WORKER_QUEUE for the CLI commands, as an operator sets it."""
    created = make_queues(backend.endpoint_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    monkeypatch.setenv("WORKER_QUEUE", created.queue_url.rsplit("/", 1)[-1])
    monkeypatch.delenv("WORKER_DEAD_LETTER_QUEUE", raising=False)
    monkeypatch.setenv("LOGNAME", "pytest-operator")  # getpass.getuser() reads LOGNAME first, then USER
    monkeypatch.setenv("USER", "pytest-operator")
    return created


@pytest_asyncio.fixture(loop_scope="function")
async def dynamodb(backend: Backend) -> AsyncIterator[DynamoDBClient]:
    """An aiobotocore DynamoDB client on the backend under test."""
    async with dynamodb_client(backend.endpoint_url) as client:
        yield client
