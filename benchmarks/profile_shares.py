"""Group a cProfile of the worker (``compare_celery.py --profile-dir``) into shares of its CPU by where the time
went: botocore and aiobotocore, SigV4 signing, aiohttp, logging, asyncio, the worker's own code, imports.

    .venv/bin/python benchmarks/profile_shares.py /tmp/prof/sqs-worker-c64-*.prof

Each function's own time (``tottime``) counts once, in the first group whose pattern its file matches; the
shares of one profile add up to 100%.
"""

from __future__ import annotations

import pstats
import re
import sys

#: (group, pattern on "file:function"), first match wins.
GROUPS: tuple[tuple[str, str], ...] = (
    ("imports at startup", r"<frozen importlib|marshal|builtins\.compile|_imp\."),
    ("SigV4 signing", r"botocore/(auth|signers)\.py|aiobotocore/signers\.py|hashlib|hmac"),
    ("botocore/aiobotocore (request building, parsing, hooks)", r"botocore/|aiobotocore/|email/|http/client"),
    ("aiohttp", r"aiohttp/|yarl/|multidict/"),
    ("logging (records, JSON, redaction)", r"logging/|worker/observability/logs\.py|json/encoder"),
    ("asyncio machinery (tasks, futures, callbacks)", r"asyncio/|_asyncio|_contextvars|selectors|uvloop"),
    ("tracing (OpenTelemetry API, no provider set)", r"opentelemetry/|worker/observability/tracing\.py"),
    ("JSON decoding (responses, envelopes)", r"json/decoder\.py|json/__init__\.py:loads"),
    ("worker code (runtime, envelope, events)", r"/worker/|pydantic"),
    ("the benchmark's handler (side channel file)", r"benchmarks/|pathlib\.py|posixpath"),
)


def shares(path: str) -> dict[str, float]:
    stats = pstats.Stats(path)
    totals: dict[str, float] = {name: 0.0 for name, _ in GROUPS}
    totals["other (builtins, json decoding, pydantic, ...)"] = 0.0
    compiled = [(name, re.compile(pattern)) for name, pattern in GROUPS]

    def group_of(key: tuple[str, int, str]) -> str:
        where = f"{key[0]}:{key[2]}"
        for name, pattern in compiled:
            if pattern.search(where):
                return name
        return "other (builtins, json decoding, pydantic, ...)"

    for key, row in stats.stats.items():  # type: ignore[attr-defined]
        tottime, callers = row[2], row[4]
        if key[0] == "~" and callers and not re.search(r"marshal|compile|_imp", key[2]):
            # A builtin (isinstance, dict.get, str.lower, ...): its time goes to the groups of its callers.
            for caller, (_cc, _nc, caller_tottime, _ct) in callers.items():
                totals[group_of(caller)] += caller_tottime
        else:
            totals[group_of(key)] += tottime
    whole = sum(totals.values()) or 1.0
    return {name: 100 * value / whole for name, value in totals.items()}


def main() -> int:
    paths = sys.argv[1:]
    if not paths:
        print(__doc__)
        return 2
    tables = [shares(path) for path in paths]
    print("| share of the worker's CPU | " + " | ".join(paths) + " |")
    print("|---|" + "---|" * len(paths))
    for name in tables[0]:
        print(f"| {name} | " + " | ".join(f"{table[name]:.1f}%" for table in tables) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
