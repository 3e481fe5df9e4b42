"""sqs-worker against Celery (kombu's SQS transport) on the same local SQS endpoint, each as a real worker process.

    bash infra/localstack/setup.sh && bash benchmarks/setup-celery.sh
    .venv/bin/python benchmarks/compare_celery.py --jobs 2000 --concurrency 20

For each side (sqs-worker; Celery with the threads pool; Celery with the prefork pool) it creates a fresh queue,
preloads N no-op jobs straight into LocalStack (not counted), then starts the worker process with its SQS traffic
routed through a counting proxy (benchmarks/countproxy.py), so both sides' requests are counted the same way.

Drain: timed from the proxy: first ReceiveMessage sent to the last DeleteMessage(Batch) answered, once every job
has recorded its start in the side channel (benchmarks/effects.py: each job appends a line to a file, the same
code on both sides) and GetQueueAttributes (asked of LocalStack directly, not counted) shows the queue empty.
jobs/s = N / drain. Requests per job = every request the worker made during the drain (startup calls included)
divided by N. CPU per job = user+system seconds of the worker's process tree from its first ReceiveMessage to the end of
the drain (startup CPU, mostly imports, reported apart), divided by N. Memory = peak of the tree's summed PSS
(proportional set size: prefork children share pages, RSS would count them once per child).

"jobs/s by starts" is timed from the side channel alone: (N - 1) / (last job's start - first job's start); with
--no-proxy it is the only timing (the workers talk to LocalStack directly), which shows what the proxy costs.

Trickle: then M more jobs are sent one at a time at R/s into the now idle worker; the latency from send to start
(p50/p95) comes from the side channel, and the requests the worker made in that phase are counted too.

Prints a table and a JSON document with the figures and the ratios sqs-worker / Celery.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402

from benchmarks import effects  # noqa: E402
from benchmarks.countproxy import NO_FAULTS, CountingProxy, FaultRates, Tally  # noqa: E402
from tests.support.backends import Backend, start_localstack  # noqa: E402
from worker.ops.bootstrap import ensure_queues  # noqa: E402
from worker.producer import Job, enqueue, enqueue_many  # noqa: E402

CELERY_VENV = Path(os.environ.get("CELERY_VENV", ROOT / ".tools" / "celery-venv"))
SQS_WORKER_BIN = Path(sys.executable).parent / "sqs-worker"
POLL_S = 0.05
MEMORY_EVERY_S = 0.25
STOP_TIMEOUT_S = 30.0
VISIBILITY_TIMEOUT_S = 60
DELETE_ACTIONS = ("DeleteMessage", "DeleteMessageBatch")


@dataclass(frozen=True)
class Side:
    name: str
    kind: str  # "sqs-worker" | "celery" | "raw"
    pool: str = ""
    threads: int = 0  # raw boto3 loop: its threads
    processes: str = ""  # sqs-worker: WORKER_PROCESSES (default: --worker-processes)
    idempotency: bool = False  # sqs-worker: jobs carry idempotency keys, WORKER_IDEMPOTENCY_TABLE is set
    baseline: bool = False  # sqs-worker: the worker package of --baseline-src
    event_loop: str = ""  # sqs-worker: WORKER_EVENT_LOOP (default: asyncio)
    prefetch: bool = False  # sqs-worker: WORKER_PREFETCH of --prefetch (default: half the concurrency)


@dataclass
class Run:
    """One side's queue, files and worker process."""

    side: Side
    queue_name: str
    queue_url: str
    workdir: Path
    effects_file: Path
    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    spawned_at: float = 0.0


# ---------------------------------------------------------------- process tree: CPU and memory from /proc


def tree_pids(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo.extend(int(child) for child in (task / "children").read_text().split())
    return pids


def tree_cpu_s(pid: int) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for member in tree_pids(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / ticks


def others_cpu_s(endpoint_pid: int | None) -> tuple[float, float]:
    """CPU seconds so far of the endpoint's process tree (0 when it was not started here) and of this script
    (the counting proxy and the side channel): what the worker's cores are shared with."""
    endpoint_s = tree_cpu_s(endpoint_pid) if endpoint_pid else 0.0
    own = os.times()
    return endpoint_s, own.user + own.system


def tree_memory_mb(pid: int) -> tuple[float, float]:
    """(summed PSS, summed RSS) of the process tree, in MiB."""
    pss_kb = rss_kb = 0
    for member in tree_pids(pid):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss_kb += int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss_kb += int(line.split()[1])
    return pss_kb / 1024, rss_kb / 1024


# ---------------------------------------------------------------- the two sides


def celery_python() -> Path:
    python = CELERY_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} missing: run `bash benchmarks/setup-celery.sh` first")
    return python


def base_env(run: Run) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            effects.EFFECTS_ENV: str(run.effects_file),
            "BENCH_QUEUE_NAME": run.queue_name,
        }
    )
    return env


def celery_queue_url(run: Run, endpoint_url: str) -> str:
    """The queue's URL on ``endpoint_url``: kombu sends ReceiveMessage to the predefined URL itself."""
    return endpoint_url + "/" + run.queue_url.split("/", 3)[3]


def celery_env(run: Run, endpoint_url: str, prefetch_multiplier: int) -> dict[str, str]:
    host_port = endpoint_url.removeprefix("http://")
    env = base_env(run)
    env.update(
        {
            "BENCH_BROKER_URL": f"sqs://bench:bench@{host_port}",
            "BENCH_QUEUE_URL": celery_queue_url(run, endpoint_url),
            "BENCH_PREFETCH_MULTIPLIER": str(prefetch_multiplier),
        }
    )
    return env


def celery_send(run: Run, endpoint_url: str, jobs: int, rate_per_s: float, timeout_s: float) -> None:
    env = celery_env(run, endpoint_url, 1)
    env["BENCH_SEND_BROKER_URL"] = env["BENCH_BROKER_URL"]
    command = [str(celery_python()), str(ROOT / "benchmarks" / "celery_app.py"), "send", "--jobs", str(jobs)]
    command += ["--rate-per-s", str(rate_per_s)]
    done = subprocess.run(  # noqa: S603 - our own fixed command line
        command, env=env, cwd=ROOT, capture_output=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"celery send failed ({done.returncode}): {done.stderr.decode()[-2000:]}")


def sqs_worker_send(client: Any, run: Run, jobs: int, rate_per_s: float, cpu_ms: float = 0.0) -> None:
    def key() -> str | None:  # with idempotency: a key of its own per job
        return uuid.uuid4().hex if run.side.idempotency else None

    if rate_per_s <= 0 and cpu_ms < 0:  # I/O-bound handlers waiting -cpu_ms ms (benchmarks/noop_handlers.py: nap)
        payload = {"sleep_s": -cpu_ms / 1000}
        batch = [Job("nap", {"n": n, "sent_at": time.time(), **payload}, key()) for n in range(jobs)]
        enqueue_many(client, run.queue_url, batch)
        return
    if rate_per_s <= 0 and cpu_ms > 0:  # CPU-bound handlers (benchmarks/noop_handlers.py: burn)
        batch = [Job("burn", {"n": n, "sent_at": time.time(), "cpu_ms": cpu_ms}, key()) for n in range(jobs)]
        enqueue_many(client, run.queue_url, batch)
        return
    if rate_per_s <= 0:
        batch = [Job("noop", {"n": n, "sent_at": time.time()}, key()) for n in range(jobs)]
        enqueue_many(client, run.queue_url, batch)
        return
    started = time.monotonic()
    for n in range(jobs):
        pause_s = started + n / rate_per_s - time.monotonic()
        if pause_s > 0:
            time.sleep(pause_s)  # pacing a producer: there is no event to await
        enqueue(client, run.queue_url, Job("noop", {"n": n, "sent_at": time.time()}, key()))


def send(
    client: Any, run: Run, endpoint_url: str, jobs: int, rate_per_s: float, timeout_s: float, cpu_ms: float = 0.0
) -> None:
    """Enqueue straight into LocalStack (``endpoint_url``), outside the counting proxy."""
    if run.side.kind == "celery":
        celery_send(run, endpoint_url, jobs, rate_per_s, timeout_s)
    else:
        sqs_worker_send(client, run, jobs, rate_per_s, cpu_ms)


def worker_command(run: Run, proxy_url: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    if run.side.kind == "raw":
        env = base_env(run)
        env.update({"AWS_ENDPOINT_URL": proxy_url, "BENCH_QUEUE_URL": run.queue_url})
        return [sys.executable, str(ROOT / "benchmarks" / "rawloop.py"), "--threads", str(run.side.threads)], env
    if run.side.kind == "celery":
        command = [
            str(CELERY_VENV / "bin" / "celery"),
            "-A",
            "benchmarks.celery_app",
            "worker",
            f"--pool={run.side.pool}",
            f"--concurrency={args.concurrency}",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-Q",
            run.queue_name,
        ]
        return command, celery_env(run, proxy_url, args.celery_prefetch_multiplier)
    env = base_env(run)
    env.update(
        {
            "AWS_ENDPOINT_URL": proxy_url,
            "WORKER_QUEUE": run.queue_url,
            "WORKER_HANDLERS": "benchmarks.noop_handlers",
            "WORKER_CONCURRENCY": str(args.concurrency),
            "WORKER_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S),
            "WORKER_METRICS": "off",
            "WORKER_LOG_LEVEL": args.log_level,
            "WORKER_HEALTH_FILE": str(run.workdir / "health"),
        }
    )
    if run.side.baseline:  # another checkout's worker package first on the path (a before/after pair in one run)
        env["PYTHONPATH"] = f"{args.baseline_src}{os.pathsep}{ROOT}"
    if run.side.idempotency:
        env["WORKER_IDEMPOTENCY_TABLE"] = f"{run.queue_name}-idempotency"
    if run.side.event_loop:
        env["WORKER_EVENT_LOOP"] = run.side.event_loop
    if run.side.prefetch:
        env["WORKER_PREFETCH"] = str(args.concurrency // 2 if args.prefetch is None else args.prefetch)
    processes = run.side.processes or args.worker_processes
    if processes != "1":
        env["WORKER_PROCESSES"] = processes
    if args.profile_dir:  # cProfile of the whole process, written at its clean exit (SIGTERM)
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        out = args.profile_dir / f"sqs-worker-c{args.concurrency}-{uuid.uuid4().hex[:6]}.prof"
        return [sys.executable, str(ROOT / "benchmarks" / "cpu_profile.py"), str(out), "run"], env
    return [str(SQS_WORKER_BIN), "run"], env


def stop_worker(run: Run) -> None:
    process = run.process
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the worker's own session: it and its pool children
        process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # prefork children left behind by a fast exit


# ---------------------------------------------------------------- measuring


class Sampler:
    """Peak memory of the worker's tree, sampled while waiting."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_pss_mb = 0.0
        self.peak_rss_mb = 0.0
        self._next_at = 0.0

    def maybe_sample(self) -> None:
        now = time.monotonic()
        if now < self._next_at:
            return
        self._next_at = now + MEMORY_EVERY_S
        pss_mb, rss_mb = tree_memory_mb(self.pid)
        self.peak_pss_mb = max(self.peak_pss_mb, pss_mb)
        self.peak_rss_mb = max(self.peak_rss_mb, rss_mb)


def queue_depth(client: Any, queue_url: str) -> int:
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return sum(int(attributes.get(name, 0)) for name in names)


def wait_done(client: Any, run: Run, target: int, sampler: Sampler, timeout_s: float) -> None:
    """Until ``target`` jobs recorded their start and the queue holds nothing (all deleted); bounded."""
    deadline = time.monotonic() + timeout_s
    assert run.process is not None
    while time.monotonic() < deadline:
        if run.process.poll() is not None:
            raise RuntimeError(f"{run.side.name} exited with {run.process.returncode}: {log_tail(run)}")
        sampler.maybe_sample()
        if effects.count(run.effects_file) >= target and queue_depth(client, run.queue_url) == 0:
            return
        time.sleep(POLL_S)  # polling another process's progress: nothing to await here
    done = effects.count(run.effects_file)
    raise TimeoutError(f"{run.side.name}: {done}/{target} jobs within {timeout_s} s: {log_tail(run)}")


def wait_first_receive(proxy: CountingProxy, run: Run, timeout_s: float) -> None:
    """Until the worker sent its first ReceiveMessage: the end of its startup (imports, clients, queue lookups)."""
    deadline = time.monotonic() + timeout_s
    assert run.process is not None
    while time.monotonic() < deadline:
        if run.process.poll() is not None:
            raise RuntimeError(f"{run.side.name} exited with {run.process.returncode}: {log_tail(run)}")
        if proxy.snapshot().counts.get("ReceiveMessage"):
            return
        time.sleep(POLL_S / 5)  # polling another process's progress: nothing to await here
    raise TimeoutError(f"{run.side.name}: no ReceiveMessage within {timeout_s} s: {log_tail(run)}")


def log_tail(run: Run) -> str:
    with contextlib.suppress(OSError):
        return run.log_file.read_text(errors="replace")[-3000:]
    return ""


def percentile_ms(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[int(fraction * (len(ordered) - 1))], 1) if ordered else 0.0


DYNAMODB_WRITES = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems")
DYNAMODB_READS = ("GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems", "DescribeTable", "DescribeTimeToLive")


def requests_summary(tally: Tally, jobs: int) -> dict[str, Any]:
    dynamodb = DYNAMODB_WRITES + DYNAMODB_READS
    total = sum(count for action, count in tally.counts.items() if action not in dynamodb)
    writes = sum(tally.counts.get(action, 0) for action in DYNAMODB_WRITES)
    return {
        "sqs_requests": total,
        "sqs_requests_per_job": round(total / jobs, 3),
        "dynamodb_writes_per_job": round(writes / jobs, 3),
        "requests_by_action": dict(sorted(tally.counts.items())),
        "request_errors": tally.errors,
    }


def create_ledger_table(endpoint_url: str, name: str) -> None:
    """The idempotency table of a side with idempotency on, made straight on LocalStack (not counted)."""
    import asyncio

    from aiobotocore.session import get_session

    from worker.idempotency.dynamodb import create_table

    async def create() -> None:
        region = os.environ["AWS_REGION"]
        async with get_session().create_client("dynamodb", region_name=region, endpoint_url=endpoint_url) as client:
            await create_table(client, name)

    asyncio.run(create())


def starts_span(run: Run, jobs: int) -> dict[str, float]:
    """Timing from the side channel alone (no proxy needed): first to last start of the preloaded jobs."""
    starts = sorted(started for _, started in effects.read(run.effects_file)[:jobs])
    span_s = starts[-1] - starts[0]
    low, high = starts[len(starts) // 10], starts[(9 * len(starts)) // 10]
    return {
        # the middle 80% of starts: steady state, without the startup of (several) processes or the tail
        "jobs_per_s_steady": round(0.8 * jobs / (high - low), 1) if high > low else 0.0,
        "starts_span_s": round(span_s, 3),
        "jobs_per_s_by_starts": round((jobs - 1) / span_s, 1) if span_s > 0 else 0.0,
        "spawn_to_first_start_s": round(starts[0] - run.spawned_at, 3),
    }


def drain_figures(drain: Tally, run: Run, jobs: int) -> dict[str, Any]:
    first_receive = drain.first_start["ReceiveMessage"]
    last_delete = max(drain.last_end.get(action, 0.0) for action in DELETE_ACTIONS)
    drain_s = last_delete - first_receive
    return {
        "drain_s": round(drain_s, 3),
        "jobs_per_s": round(jobs / drain_s, 1),
        "spawn_to_done_s": round(last_delete - run.spawned_at, 3),
        "startup_s": round(first_receive - run.spawned_at, 3),
        **requests_summary(drain, jobs),
    }


def trickle_figures(run: Run, args: argparse.Namespace, tally: Tally | None) -> dict[str, Any]:
    waits = [started - sent for sent, started in effects.read(run.effects_file)[args.jobs :]]
    figures: dict[str, Any] = {
        "jobs": args.trickle_jobs,
        "rate_per_s": args.trickle_rate_per_s,
        "latency_p50_ms": percentile_ms(waits, 0.5),
        "latency_p95_ms": percentile_ms(waits, 0.95),
        "latency_max_ms": percentile_ms(waits, 1.0),
    }
    if tally is not None:
        figures.update(requests_summary(tally, args.trickle_jobs))
    return figures


def prepare(side: Side, client: Any, endpoint_url: str, args: argparse.Namespace, scratch: Path) -> Run:
    """A fresh queue (with its DLQ, as sqs-worker bootstrap makes it) holding ``args.jobs`` jobs of the side's kind."""
    queue_name = f"bench-{side.name}-{uuid.uuid4().hex[:8]}"
    created = ensure_queues(client, queue_name, visibility_timeout_s=VISIBILITY_TIMEOUT_S)
    workdir = scratch / side.name
    workdir.mkdir()
    run = Run(side, queue_name, created.queue_url, workdir, workdir / "effects.txt", workdir / "worker.log")
    if side.idempotency:
        create_ledger_table(endpoint_url, f"{queue_name}-idempotency")
    cpu_ms = -1000 * args.job_sleep_s if args.job_sleep_s else args.job_cpu_ms
    send(client, run, endpoint_url, args.jobs, 0.0, args.timeout_s, cpu_ms)
    if queue_depth(client, run.queue_url) != args.jobs:
        raise RuntimeError(f"{side.name}: preload left {queue_depth(client, run.queue_url)} messages, not {args.jobs}")
    return run


def measure_side(side: Side, endpoint_url: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    client = boto3.client("sqs", endpoint_url=endpoint_url, region_name=os.environ["AWS_REGION"])
    run = prepare(side, client, endpoint_url, args, scratch)
    delay = FaultRates(delay=1.0, delay_s=args.endpoint_delay_ms / 1000) if args.endpoint_delay_ms else NO_FAULTS
    proxy = None if args.no_proxy else CountingProxy(endpoint_url, rates=delay)
    try:
        if proxy is not None:
            proxy.start()
        command, env = worker_command(run, proxy.endpoint_url if proxy else endpoint_url, args)
        with run.log_file.open("wb") as log:
            run.spawned_at = time.time()
            run.process = subprocess.Popen(  # noqa: S603 - our own fixed command line
                command,
                env=env,
                # The baseline runs in its own tree: from ours, our worker/ folder would shadow its package.
                cwd=args.baseline_src if run.side.baseline else ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=pin_to(args.pin_cpus),
            )
        sampler = Sampler(run.process.pid)
        result: dict[str, Any] = {"side": side.name, "jobs": args.jobs, "concurrency": concurrency_of(side, args)}
        cpu_startup_s = 0.0
        if proxy is not None:
            wait_first_receive(proxy, run, args.timeout_s)
            cpu_startup_s = tree_cpu_s(run.process.pid)
        others_before = others_cpu_s(args.endpoint_pid)
        wait_done(client, run, args.jobs, sampler, args.timeout_s)
        cpu_drain_s = tree_cpu_s(run.process.pid) - cpu_startup_s
        others_after = others_cpu_s(args.endpoint_pid)
        if proxy is not None:
            result.update(drain_figures(proxy.snapshot(), run, args.jobs))
            proxy.reset()
        result.update(starts_span(run, args.jobs))
        if args.job_sleep_s and "drain_s" in result:  # the share of slot-time spent inside handlers
            busy_s = args.jobs * args.job_sleep_s
            result["handler_utilization"] = round(busy_s / (args.concurrency * result["drain_s"]), 3)
            # the same over the middle 80% of starts: without the first receives and the last, partial, round
            steady = result["jobs_per_s_steady"] * args.job_sleep_s / args.concurrency
            result["handler_utilization_steady"] = round(steady, 3)
        drain_s = result.get("drain_s") or result.get("starts_span_s")
        if drain_s:  # the cores the endpoint and this script (proxy, side channel) used meanwhile
            result["worker_cores"] = round(cpu_drain_s / drain_s, 2)
            result["endpoint_cores"] = round((others_after[0] - others_before[0]) / drain_s, 2)
            result["harness_cores"] = round((others_after[1] - others_before[1]) / drain_s, 2)
        if proxy is not None:  # the first ReceiveMessage marks the end of startup
            result["cpu_startup_s"] = round(cpu_startup_s, 2)
            result["cpu_drain_s"] = round(cpu_drain_s, 2)
            result["cpu_ms_per_job"] = round(1000 * cpu_drain_s / args.jobs, 3)
        else:
            result["cpu_startup_and_drain_s"] = round(cpu_drain_s, 2)
        if args.trickle_jobs:
            send(client, run, endpoint_url, args.trickle_jobs, args.trickle_rate_per_s, args.timeout_s)
            wait_done(client, run, args.jobs + args.trickle_jobs, sampler, args.timeout_s)
            result["trickle"] = trickle_figures(run, args, proxy.snapshot() if proxy else None)
        sampler.maybe_sample()
        result["peak_pss_mb"] = round(sampler.peak_pss_mb, 1)
        result["peak_rss_sum_mb"] = round(sampler.peak_rss_mb, 1)
        result["processes"] = len(tree_pids(run.process.pid))
        return result
    finally:
        stop_worker(run)
        if proxy is not None:
            proxy.stop()
        with contextlib.suppress(Exception):
            client.delete_queue(QueueUrl=run.queue_url)


# ---------------------------------------------------------------- report

#: Figures compared across sides; for each, which way is better (True: more is better).
FIGURES = {
    "jobs_per_s": True,
    "jobs_per_s_steady": True,
    "jobs_per_s_by_starts": True,
    "sqs_requests_per_job": False,
    "cpu_ms_per_job": False,
    "peak_pss_mb": False,
}
RAW_SIDES = ("raw-1", "raw-4")
CELERY_SIDES = ("celery-threads", "celery-prefork")


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def ratios(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """base / other, per figure (above 1: base has more of it); latency also as a difference in ms."""
    out = {name: ratio(base[name], other[name]) for name in FIGURES if name in base and name in other}
    if "trickle" in base and "trickle" in other:
        out["trickle_latency_p50_ms"] = ratio(base["trickle"]["latency_p50_ms"], other["trickle"]["latency_p50_ms"])
        out["trickle_latency_p50_minus_ms"] = round(
            base["trickle"]["latency_p50_ms"] - other["trickle"]["latency_p50_ms"], 1
        )
    return out


def label(result: dict[str, Any]) -> str:
    side = str(result["side"])
    return side if side in RAW_SIDES else f"{side}@{result['concurrency']}"


def best_celery(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Celery run with the most jobs/s in one repeat (its best pool and concurrency)."""
    celery = [r for r in results if r["side"] in CELERY_SIDES and "jobs_per_s" in r]
    return max(celery, key=lambda r: r["jobs_per_s"], default=None)


def repeat_ratios(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every side of one repeat against the raw loops and Celery's best run of the same repeat."""
    references = {side: next((r for r in results if r["side"] == side), None) for side in RAW_SIDES}
    references["celery-best"] = best_celery(results)
    out: dict[str, dict[str, Any]] = {}
    for result in results:
        out[label(result)] = {
            f"vs {name}": ratios(result, reference)
            for name, reference in references.items()
            if reference is not None and reference is not result
        }
        level = result["concurrency"]
        one = next((r for r in results if r["side"] == "sqs-worker" and r["concurrency"] == level), None)
        if one is not None and result["side"] in ("sqs-worker-p2", "sqs-worker-idem", "sqs-worker-base"):
            out[label(result)]["vs sqs-worker"] = ratios(result, one)
    return out


CORES = ("worker_cores", "endpoint_cores", "harness_cores")


def table(results: list[dict[str, Any]]) -> str:
    columns: list[tuple[str, Callable[[dict[str, Any]], object]]] = [
        ("side", label),
        ("repeat", lambda r: r.get("repeat", 0)),
        ("jobs/s", lambda r: r.get("jobs_per_s", "")),
        ("drain s", lambda r: r.get("drain_s", "")),
        ("jobs/s by starts", lambda r: r["jobs_per_s_by_starts"]),
        ("steady jobs/s", lambda r: r["jobs_per_s_steady"]),
        ("req/job", lambda r: r.get("sqs_requests_per_job", "")),
        ("cpu ms/job", lambda r: r.get("cpu_ms_per_job", "")),
        ("PSS MB", lambda r: r["peak_pss_mb"]),
        ("procs", lambda r: r["processes"]),
        ("spawn to 1st job s", lambda r: r["spawn_to_first_start_s"]),
        ("trickle p50 ms", lambda r: r.get("trickle", {}).get("latency_p50_ms", "")),
        ("trickle p95 ms", lambda r: r.get("trickle", {}).get("latency_p95_ms", "")),
        ("trickle req/job", lambda r: r.get("trickle", {}).get("sqs_requests_per_job", "")),
        ("ddb writes/job", lambda r: r.get("dynamodb_writes_per_job", "")),
        ("handler util", lambda r: r.get("handler_utilization", "")),
        ("steady util", lambda r: r.get("handler_utilization_steady", "")),
        ("RSS MB", lambda r: r["peak_rss_sum_mb"]),
        ("cores: worker/endpoint/harness", lambda r: "/".join(str(r.get(k, "")) for k in CORES)),
    ]
    lines = ["| " + " | ".join(name for name, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(get(r)) for _, get in columns) + " |" for r in results]
    return "\n".join(lines)


def ratio_table(by_repeat: list[dict[str, dict[str, Any]]]) -> str:
    """Per side, the ratios of every repeat (min..max when repeated): jobs/s and CPU to the raw loops and Celery."""
    picks = [
        ("jobs/s vs raw-4", "vs raw-4", "jobs_per_s"),
        ("jobs/s vs raw-1", "vs raw-1", "jobs_per_s"),
        ("jobs/s vs celery best", "vs celery-best", "jobs_per_s"),
        ("cpu/job vs raw-1", "vs raw-1", "cpu_ms_per_job"),
        ("cpu/job vs raw-4", "vs raw-4", "cpu_ms_per_job"),
        ("cpu/job vs celery best", "vs celery-best", "cpu_ms_per_job"),
        ("req/job vs raw-1", "vs raw-1", "sqs_requests_per_job"),
        ("req/job vs celery best", "vs celery-best", "sqs_requests_per_job"),
        ("p50 ms minus raw-1", "vs raw-1", "trickle_latency_p50_minus_ms"),
        ("jobs/s vs sqs-worker (1 process, no idempotency)", "vs sqs-worker", "jobs_per_s"),
        ("steady jobs/s vs sqs-worker", "vs sqs-worker", "jobs_per_s_steady"),
    ]
    sides = list(dict.fromkeys(name for repeat in by_repeat for name in repeat))
    lines = ["| side | " + " | ".join(title for title, _, _ in picks) + " |", "|" + "---|" * (len(picks) + 1)]
    for side in sides:
        cells = []
        for _, versus, figure in picks:
            values = [
                repeat[side][versus][figure]
                for repeat in by_repeat
                if side in repeat and versus in repeat[side] and repeat[side][versus].get(figure) is not None
            ]
            cells.append(spread(values))
        lines.append(f"| {side} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread(values: list[float]) -> str:
    if not values:
        return ""
    low, high = min(values), max(values)
    return f"{low:g}" if low == high else f"{low:g}..{high:g}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint-url", help="a running LocalStack (default: start one for the run)")
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument(
        "--concurrency", default="20", help="one or more, comma-separated (sqs-worker and Celery run at each)"
    )
    parser.add_argument(
        "--sides",
        default="raw-1,raw-4,sqs-worker,celery-threads,celery-prefork",
        help="comma-separated, of: " + ", ".join(SIDES),
    )
    parser.add_argument("--repeats", type=int, default=1, help="run every side this many times (shows the spread)")
    parser.add_argument(
        "--pin-cpus", default="", help="CPUs each worker process may use, e.g. 1 or 0,1 (default: any CPU)"
    )
    parser.add_argument("--worker-processes", default="1", help="WORKER_PROCESSES of the sqs-worker side")
    parser.add_argument(
        "--log-level", default="WARNING", help="WORKER_LOG_LEVEL of the sqs-worker sides (INFO: two lines a job)"
    )
    parser.add_argument(
        "--job-cpu-ms", type=float, default=0.0, help="sqs-worker sides: handlers burn this much CPU per job"
    )
    parser.add_argument("--endpoint-delay-ms", type=float, default=0.0, help="the proxy delays every request this long")
    parser.add_argument(
        "--job-sleep-s", type=float, default=0.0, help="sqs-worker sides: handlers wait this long (jobs in flight)"
    )
    parser.add_argument("--celery-prefetch-multiplier", type=int, default=1)
    parser.add_argument(
        "--prefetch", type=int, help="WORKER_PREFETCH of the *-prefetch sides (default: half the concurrency)"
    )
    parser.add_argument("--trickle-jobs", type=int, default=100, help="0: skip the latency phase")
    parser.add_argument("--trickle-rate-per-s", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="bound on every wait")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--profile-dir", type=Path, help="run the sqs-worker side under cProfile, writing here")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="a folder holding another version's worker package (git archive REV worker | tar -x -C DIR): "
        "the sqs-worker-base side runs it",
    )
    parser.add_argument(
        "--no-proxy",
        action="store_true",
        help="workers talk to LocalStack directly: no request counts, timing from the side channel only "
        "(shows what the counting proxy costs each side)",
    )
    return parser.parse_args()


SIDES = {
    "raw-1": Side("raw-1", "raw", threads=1),
    "raw-4": Side("raw-4", "raw", threads=4),
    "sqs-worker": Side("sqs-worker", "sqs-worker"),
    "sqs-worker-p2": Side("sqs-worker-p2", "sqs-worker", processes="2"),
    "sqs-worker-uvloop": Side("sqs-worker-uvloop", "sqs-worker", event_loop="uvloop"),
    "sqs-worker-p2-uvloop": Side("sqs-worker-p2-uvloop", "sqs-worker", processes="2", event_loop="uvloop"),
    "sqs-worker-prefetch": Side("sqs-worker-prefetch", "sqs-worker", prefetch=True),
    "sqs-worker-prefetch-uvloop": Side("sqs-worker-prefetch-uvloop", "sqs-worker", event_loop="uvloop", prefetch=True),
    "sqs-worker-idem": Side("sqs-worker-idem", "sqs-worker", idempotency=True),
    "sqs-worker-base": Side("sqs-worker-base", "sqs-worker", baseline=True),
    "sqs-worker-base-idem": Side("sqs-worker-base-idem", "sqs-worker", baseline=True, idempotency=True),
    "celery-threads": Side("celery-threads", "celery", "threads"),
    "celery-prefork": Side("celery-prefork", "celery", "prefork"),
}


def concurrency_of(side: Side, args: argparse.Namespace) -> int:
    return side.threads if side.kind == "raw" else int(args.concurrency)


def pin_to(cpus: str) -> Callable[[], None] | None:
    if not cpus:
        return None
    chosen = {int(cpu) for cpu in cpus.split(",")}
    return lambda: os.sched_setaffinity(0, chosen)


def plan(sides: list[Side], args: argparse.Namespace) -> list[tuple[Side, argparse.Namespace]]:
    """Each side at each concurrency (the raw loops once: their threads are their concurrency)."""
    runs = []
    for side in sides:
        levels = [args.concurrency.split(",")[0]] if side.kind == "raw" else args.concurrency.split(",")
        for level in levels:
            runs.append((side, argparse.Namespace(**{**vars(args), "concurrency": int(level)})))
    return runs


def main() -> int:
    args = parse_args()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(name, value)
    sides = [SIDES[name] for name in args.sides.split(",")]
    if any(side.kind == "celery" for side in sides):
        celery_python()
    backend: Backend | None = None if args.endpoint_url else start_localstack()
    endpoint_url = args.endpoint_url or (backend.endpoint_url if backend else "")
    args.endpoint_pid = backend.process.pid if backend is not None and backend.process is not None else None
    results: list[dict[str, Any]] = []
    by_repeat: list[dict[str, dict[str, Any]]] = []
    loads = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-celery-") as scratch:
            for repeat in range(args.repeats):
                this_repeat = []
                for side, side_args in plan(sides, args):
                    print(f"repeat {repeat}: {side.name} at {side_args.concurrency} ...", file=sys.stderr, flush=True)
                    loads.append(os.getloadavg()[0])
                    workdir = Path(scratch) / f"r{repeat}-c{side_args.concurrency}"
                    workdir.mkdir(exist_ok=True)
                    result = measure_side(side, endpoint_url, side_args, workdir)
                    result["repeat"] = repeat
                    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
                    this_repeat.append(result)
                results.extend(this_repeat)
                by_repeat.append(repeat_ratios(this_repeat))
    finally:
        if backend is not None:
            backend.stop()
    report = {
        "endpoint": "localstack" + ("" if args.no_proxy else " via counting proxy"),
        "cpus": os.cpu_count(),
        "pinned_cpus": args.pin_cpus or "any",
        "load_avg_1m": {"min": round(min(loads), 2), "max": round(max(loads), 2)} if loads else {},
        "command": " ".join(sys.argv),
        "results": results,
        "ratios_by_repeat": by_repeat,
    }
    print(table(results))
    print()
    print(ratio_table(by_repeat))
    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
