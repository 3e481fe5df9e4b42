"""A report built in parallel: a request job fans out chunk jobs as a group (``worker.workflows``), each chunk
writes its rows to S3, and the group's callback assembles them into one CSV object and keeps a presigned URL as
its result. Enable it with ``WORKER_HANDLERS=worker.recipes.report`` (plus the module with your sources),
``WORKER_REPORT_BUCKET`` and ``WORKER_IDEMPOTENCY_TABLE``; copy it to make your own.

Job type ``report``, payload ``{"report_id": "r-1", "source": "numbers", "rows": 10000, "chunk_rows": 1000,
"params": {...}}``. A source is a function registered with ``@source("name")`` that returns the header and the
rows ``start`` to ``stop`` (exclusive). The report's workflow id is ``report-<report_id>``:
``sqs-worker status report-<report_id>`` shows n of m chunks done (the percentage) and, once assembled, the
callback's result ``{"url", "bucket", "key", "rows"}``. A chunk that fails for good dead-letters the assembly
(the group's ``on_failure="dead_letter"``): no partial report is ever published.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.context import JobContext
from worker.errors import PermanentError
from worker.jobs import Registry, default_registry

REQUEST, CHUNK, ASSEMBLE = "report", "report.chunk", "report.assemble"
MAX_CHUNKS = 1000

Rows = Sequence[Sequence[Any]]
#: A source: (start, stop, params) -> (header, rows start..stop-1).
Source = Callable[[int, int, dict[str, Any]], tuple[list[str], Rows]]
SOURCES: dict[str, Source] = {}


class ReportSettings(BaseSettings):
    """``WORKER_REPORT_*`` variables (or ``.env`` lines)."""

    model_config = SettingsConfigDict(env_prefix="WORKER_REPORT_", env_file=".env", extra="ignore")

    bucket: str | None = None
    prefix: str = "reports/"
    url_expires_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)


@dataclass(frozen=True)
class Wiring:
    """Where the report jobs connect: settings, the AWS connection of their clients (``client_kwargs``), and the
    queue and table the chunk group starts on. Unset parts come from the variables (WORKER_REPORT_*,
    WORKER_QUEUE, WORKER_IDEMPOTENCY_TABLE, AWS_*)."""

    settings: ReportSettings | None = None
    connection: Mapping[str, Any] | None = None
    queue: str | None = None
    table: str | None = None


_wiring = Wiring()


def configure(wiring: Wiring) -> None:
    """Wire the report jobs explicitly (``sqs-worker dev`` does: its embedded endpoint is not in the variables)."""
    global _wiring
    _wiring = wiring


class ReportRequest(BaseModel):
    report_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,80}$")
    source: str
    rows: int = Field(ge=0, le=100_000_000)
    chunk_rows: int = Field(default=1000, ge=1)
    params: dict[str, Any] = Field(default_factory=dict)


class Chunk(BaseModel):
    report_id: str
    source: str
    index: int
    start: int
    stop: int
    params: dict[str, Any] = Field(default_factory=dict)


class Assemble(BaseModel):
    report_id: str
    chunks: int


def source(name: str) -> Callable[[Source], Source]:
    """Register a report source under ``name``."""

    def decorate(function: Source) -> Source:
        SOURCES[name] = function
        return function

    return decorate


@source("numbers")
def numbers(start: int, stop: int, params: dict[str, Any]) -> tuple[list[str], Rows]:
    """The demo source: n, n squared and n cubed."""
    return ["n", "square", "cube"], [(n, n * n, n * n * n) for n in range(start, stop)]


# ----------------------------------------------------------------------------------------------- pure parts


def chunk_bounds(rows: int, chunk_rows: int) -> list[tuple[int, int]]:
    """[start, stop) of each chunk; one empty chunk for an empty report (the header is still written)."""
    bounds = [(start, min(start + chunk_rows, rows)) for start in range(0, rows, chunk_rows)] or [(0, 0)]
    if len(bounds) > MAX_CHUNKS:
        raise PermanentError(f"{len(bounds)} chunks exceed {MAX_CHUNKS}: raise chunk_rows")
    return bounds


def to_csv(rows: Rows, header: list[str] | None = None) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if header is not None:
        writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def part_key(prefix: str, report_id: str, index: int) -> str:
    return f"{prefix}{report_id}/part-{index:05d}.csv"


def report_key(prefix: str, report_id: str) -> str:
    return f"{prefix}{report_id}.csv"


# ----------------------------------------------------------------------------------------------- the jobs


def _bucket() -> tuple[ReportSettings, str]:
    settings = _wiring.settings or ReportSettings()
    if not settings.bucket:
        raise PermanentError("set WORKER_REPORT_BUCKET to build reports")
    return settings, settings.bucket


def _s3() -> Any:
    from worker.backends.aws import sync_client

    return sync_client("s3", connection=_wiring.connection)


def request(payload: ReportRequest, ctx: JobContext) -> dict[str, Any]:
    """Fan out one chunk job per ``chunk_rows`` rows; the assembly runs when the last one finished."""
    from worker.producer import Job
    from worker.workflows import group

    _bucket()
    if payload.source not in SOURCES:
        raise PermanentError(f"no report source {payload.source!r} (register it with @source)")
    bounds = chunk_bounds(payload.rows, payload.chunk_rows)
    members = [
        Job(
            CHUNK,
            Chunk(
                report_id=payload.report_id,
                source=payload.source,
                index=i,
                start=start,
                stop=stop,
                params=payload.params,
            ).model_dump(),
        )
        for i, (start, stop) in enumerate(bounds)
    ]
    callback = Job(ASSEMBLE, Assemble(report_id=payload.report_id, chunks=len(bounds)).model_dump())
    workflow_id = f"report-{payload.report_id}"
    # A fixed workflow id: a retry of this job finds the group started and sends copies that run once.
    flow = group(members, callback=callback, on_failure="dead_letter", workflow_id=workflow_id)
    if _wiring.connection is None:
        flow.start(queue=_wiring.queue, table=_wiring.table)
    else:
        from worker.backends.aws import sync_client

        connection = _wiring.connection
        sqs, dynamodb = sync_client("sqs", connection=connection), sync_client("dynamodb", connection=connection)
        flow.start(sqs=sqs, dynamodb=dynamodb, queue=_wiring.queue, table=_wiring.table)
    return {"report_id": payload.report_id, "workflow_id": workflow_id, "chunks": len(bounds)}


def chunk(payload: Chunk, ctx: JobContext) -> dict[str, Any]:
    settings, bucket = _bucket()
    produce = SOURCES.get(payload.source)
    if produce is None:
        raise PermanentError(f"no report source {payload.source!r}")
    header, rows = produce(payload.start, payload.stop, payload.params)
    key = part_key(settings.prefix, payload.report_id, payload.index)
    text = to_csv(rows, header if payload.index == 0 else None)
    _s3().put_object(Bucket=bucket, Key=key, Body=text.encode("utf-8"), ContentType="text/csv")
    return {"key": key, "rows": len(rows)}


def assemble(payload: Assemble, ctx: JobContext) -> dict[str, Any]:
    """Concatenate the parts in order into one object; its presigned URL is the report's result."""
    settings, bucket = _bucket()
    s3 = _s3()
    results = (ctx.previous_result or {}).get("results") or []
    rows = sum(int(r.get("rows", 0)) for r in results if isinstance(r, dict))
    key = report_key(settings.prefix, payload.report_id)
    if not _exists(s3, bucket, key):  # a retry after the parts were merged and removed finds the report there
        body = io.BytesIO()
        for index in range(payload.chunks):
            part = s3.get_object(Bucket=bucket, Key=part_key(settings.prefix, payload.report_id, index))
            body.write(part["Body"].read())
        s3.put_object(Bucket=bucket, Key=key, Body=body.getvalue(), ContentType="text/csv")
    for index in range(payload.chunks):
        s3.delete_object(Bucket=bucket, Key=part_key(settings.prefix, payload.report_id, index))
    url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=settings.url_expires_s
    )
    return {"url": url, "bucket": bucket, "key": key, "rows": rows}


def _exists(s3: Any, bucket: str, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


#: Each job's options; ``register(registry, **options)`` overrides them for all three.
JOB_OPTIONS: dict[str, Any] = {"max_attempts": 5, "timeout_s": 600}


def register(registry: Registry, **options: Any) -> None:
    """Register ``report``, ``report.chunk`` and ``report.assemble`` on ``registry`` (the default one on import)."""
    merged = {**JOB_OPTIONS, **options}
    registry.job(REQUEST, key=lambda p: p.report_id, **merged)(request)
    registry.job(CHUNK, **merged)(chunk)
    registry.job(ASSEMBLE, **merged)(assemble)


register(default_registry)
