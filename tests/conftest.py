from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.backends import Backend, start_localstack, start_moto

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_REGION", "us-east-1")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
for _name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
    os.environ.pop(_name, None)

#: Every backend the integration suite runs on; SQS_WORKER_TEST_BACKENDS=moto narrows a local run (never in CI).
BACKENDS = os.environ.get("SQS_WORKER_TEST_BACKENDS", "moto,localstack").split(",")


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


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each backend the integration suite runs against, started once per session."""
    started: Backend = request.getfixturevalue(f"{request.param}_backend")
    return started
