"""The pytest plugin of sqs-worker (registered under ``pytest11``): the ``sqs_worker`` fixture.

``sqs_worker`` is a fresh :class:`worker.testing.InMemoryWorker` over the handlers of ``from worker import job``;
for the whole test, ``.enqueue`` of any handler or ``JobRef`` sends to its in-memory queue (never to AWS).
Importing this module costs nothing until the fixture is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from worker.testing import InMemoryWorker


@pytest.fixture
def sqs_worker() -> Iterator[InMemoryWorker]:
    """An in-memory queue, its DLQ and ledger, and the real worker to run over them (``run_until_idle``)."""
    from worker.testing import InMemoryWorker

    kit = InMemoryWorker()
    with kit.producing():
        yield kit
