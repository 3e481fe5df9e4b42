"""Whether the endpoints the worker talks to (SQS, DynamoDB) are reachable, as the worker reports it: an endpoint
becomes unreachable when its calls have failed for :data:`UNREACHABLE_AFTER_S` with none succeeding in between
(one failed call on a flaky network is not an outage), and reachable again at its next successful call. Each
change is reported once (the log observer writes one line for each, ``/readyz`` and ``sqs_worker_endpoint_up``
follow it); the first successful call reports the endpoint reachable, so its gauge has a sample from then on."""

from __future__ import annotations

import logging
from collections.abc import Callable

from worker.observability.events import Observers

log = logging.getLogger("worker")

#: How long an endpoint's calls must keep failing, none succeeding, before it counts as unreachable.
UNREACHABLE_AFTER_S = 1.0


def is_outage(*, failing_since_s: float, now_s: float) -> bool:
    """Whether calls failing since ``failing_since_s`` (none succeeding since) make an outage at ``now_s``."""
    return now_s - failing_since_s >= UNREACHABLE_AFTER_S


class Connectivity:
    """The reachability of one service's endpoint (``service``: "sqs" or "dynamodb"): call :meth:`down` after
    each failed call and :meth:`up` after each successful one."""

    def __init__(self, service: str, observers: Observers, *, monotonic: Callable[[], float]) -> None:
        self.service = service
        #: None until the first call told (neither reported yet).
        self.reachable: bool | None = None
        self._observers = observers
        self._monotonic = monotonic
        self._failing_since_s: float | None = None

    def down(self, error: BaseException) -> None:
        now_s = self._monotonic()
        if self._failing_since_s is None:
            self._failing_since_s = now_s
        log.debug("%s call failed: %s", self.service, error)
        if self.reachable is not False and is_outage(failing_since_s=self._failing_since_s, now_s=now_s):
            self.reachable = False
            self._observers.connectivity(service=self.service, reachable=False)

    def up(self) -> None:
        self._failing_since_s = None
        if self.reachable is not True:
            self.reachable = True
            self._observers.connectivity(service=self.service, reachable=True)
