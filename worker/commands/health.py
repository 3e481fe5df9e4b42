"""``sqs-worker health [--check] [--url URL]``: is the worker on this machine (container) alive?

Reads the liveness file the running worker rewrites each second (``WORKER_HEALTH_FILE``) and compares its
age with ``WORKER_HEALTH_MAX_AGE_S``; with ``--url``, asks a running worker's ``/healthz`` or ``/readyz``
instead. Exit code 0 when healthy, 1 when not: a container HEALTHCHECK runs ``sqs-worker health --check``.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any

from worker.commands import plain_help
from worker.observability.health import HealthStatus, check_liveness_file
from worker.settings import load_settings

#: The check does not consume a queue; WORKER_QUEUE need not be set where it runs.
_NO_QUEUE = "(not used by the health check)"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "health",
        help="check that the worker is alive (liveness file or HTTP endpoint); exit 0 healthy, 1 not",
        description=plain_help(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="print one line only (for a container HEALTHCHECK)")
    parser.add_argument("--url", help="check this endpoint (e.g. http://127.0.0.1:8080/healthz) instead of the file")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="HTTP timeout with --url (default 3)")
    parser.set_defaults(func=run)


def check_url(url: str, timeout_s: float) -> HealthStatus:
    if not url.startswith(("http://", "https://")):
        return HealthStatus(False, f"not an http(s) URL: {url}", {})
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - scheme checked above  # nosec B310
            body = response.read(65536).decode("utf-8", "replace")
            return HealthStatus(True, f"{url} answered {response.status}", _details(body))
    except urllib.error.HTTPError as exc:
        body = exc.read(65536).decode("utf-8", "replace")
        return HealthStatus(False, f"{url} answered {exc.code}", _details(body))
    except (OSError, ValueError) as exc:
        return HealthStatus(False, f"{url} did not answer: {exc}", {})


def _details(body: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {"body": body[:200]}
    return data if isinstance(data, dict) else {"body": data}


def run(args: argparse.Namespace) -> int:
    if args.url:
        status = check_url(args.url, args.timeout_s)
    else:
        settings = load_settings(queue=_NO_QUEUE)
        status = check_liveness_file(settings.health_file, max_age_s=settings.health_max_age_s)
    if args.check:
        print(("healthy: " if status.ok else "unhealthy: ") + status.reason)
    else:
        print(json.dumps({"healthy": status.ok, "reason": status.reason, **status.details}, indent=2))
    return 0 if status.ok else 1
