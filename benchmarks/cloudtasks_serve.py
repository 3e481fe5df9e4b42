"""serve-tasks under load: N no-op deliveries POSTed by C parallel clients (as Cloud Tasks would push them), the
ledger on or off, against a moto server for DynamoDB. Prints deliveries/s and answer latency percentiles.

    .venv/bin/python benchmarks/cloudtasks_serve.py --deliveries 2000 --clients 10 [--idempotent]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.backends import start_moto
from tests.support.cloudtasks import SECRET, make_dead_letter_table, serving
from worker.idempotency import create_table
from worker.jobs import Registry


def client_loop(port: int, bodies: list[bytes], latencies: list[float], statuses: list[int]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for body in bodies:
        headers = {
            "X-Worker-Secret": SECRET,
            "X-CloudTasks-TaskName": uuid.uuid4().hex,
            "Content-Type": "application/json",
        }
        started = time.perf_counter()
        connection.request("POST", "/tasks", body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        latencies.append(time.perf_counter() - started)
        statuses.append(response.status)
    connection.close()


async def main(args: argparse.Namespace) -> None:
    moto = start_moto()
    os.environ["AWS_ENDPOINT_URL"] = moto.endpoint_url
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_REGION", "us-east-1")
    try:
        table = await make_dead_letter_table(moto.endpoint_url)
        ledger = None
        if args.idempotent:
            from aiobotocore.session import get_session

            ledger = f"ledger-{table}"
            async with get_session().create_client(
                "dynamodb", endpoint_url=moto.endpoint_url, region_name="us-east-1"
            ) as client:
                await create_table(client, ledger)
        registry = Registry()

        @registry.job("noop", idempotent=args.idempotent)
        async def noop(payload: dict[str, Any]) -> None:
            return None

        bodies = [json.dumps({"type": "noop", "payload": {"n": n}}).encode() for n in range(args.deliveries)]
        with tempfile.TemporaryDirectory() as folder:
            async with serving(
                registry,
                queue="bench",
                dead_letter_table=table,
                tmp_path=Path(folder),
                idempotency_table=ledger,
                concurrency=args.clients,
            ) as server:
                logging_off()
                latencies: list[float] = []
                statuses: list[int] = []
                shares = [bodies[i :: args.clients] for i in range(args.clients)]
                threads = [
                    threading.Thread(target=client_loop, args=(server.port, share, latencies, statuses))
                    for share in shares
                ]
                started = time.perf_counter()
                await asyncio.to_thread(lambda: [t.start() for t in threads] and [t.join() for t in threads])
                elapsed = time.perf_counter() - started
        latencies.sort()
        print(
            f"{args.deliveries} deliveries, {args.clients} clients, ledger {'on' if args.idempotent else 'off'}: "
            f"{args.deliveries / elapsed:.0f}/s; answer latency p50 {statistics.median(latencies) * 1000:.1f} ms, "
            f"p99 {latencies[int(len(latencies) * 0.99) - 1] * 1000:.1f} ms; statuses {sorted(set(statuses))}"
        )
    finally:
        moto.stop()


def logging_off() -> None:
    import logging

    logging.getLogger("worker").setLevel(logging.ERROR)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--idempotent", action="store_true")
    asyncio.run(main(parser.parse_args()))
