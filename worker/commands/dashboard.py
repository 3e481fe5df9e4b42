"""``sqs-worker dashboard [--host H] [--port N]``: queues, dead letters, jobs, schedules and workers on a web page.

Listens on 127.0.0.1:8181 unless WORKER_DASHBOARD_HOST/PORT say otherwise; any other address needs
WORKER_DASHBOARD_TOKEN (or WORKER_DASHBOARD_TRUST_ALB_OIDC=true behind an ALB that authenticates users).
Read-only unless WORKER_DASHBOARD_ACTIONS=true. Needs the 'dashboard' extra:
pip install '/path/to/sqs-worker[dashboard]'.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from worker.commands import plain_help


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="serve the web dashboard (queues, dead letters, jobs, schedules, workers)",
        description=plain_help(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", help="address to listen on (default: WORKER_DASHBOARD_HOST, else 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: WORKER_DASHBOARD_PORT, else 8181; 0: a free one)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from worker.dashboard.config import DashboardSettings
    from worker.dashboard.serve import serve_dashboard
    from worker.observability.logs import configure_logging
    from worker.settings import load_settings

    overrides: dict[str, object] = {}
    if args.host is not None:
        overrides["dashboard_host"] = args.host
    if args.port is not None:
        overrides["dashboard_port"] = args.port
    settings = load_settings(DashboardSettings, **overrides)
    configure_logging(settings)

    def listening(url: str) -> None:
        print(f"sqs-worker dashboard: {url}", file=sys.stderr, flush=True)

    asyncio.run(serve_dashboard(settings, on_listening=listening))
    return 0
