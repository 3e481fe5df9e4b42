"""Creating tasks with the official ``google-cloud-tasks`` client: the envelope as the HTTP body.

- Task name from the idempotency key (``key-<sha256 of the key>``): Cloud Tasks refuses a second task of the same
  name (for about an hour after the first was deleted or ran, up to 9 days), so a repeated enqueue is deduplicated
  by Cloud Tasks itself; the hash keeps names within its alphabet and spreads them (sequential names are slow).
- Delay (``delay_s``) or due time (``run_at``): ``schedule_time`` (up to 30 days ahead).
- Authentication: an OIDC token for WORKER_CLOUDTASKS_SERVICE_ACCOUNT with the audience; or, for local use, the
  shared secret as an ``X-Worker-Secret`` header of the task (visible to whoever may read the queue's tasks).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from worker.backends.cloudtasks.auth import SECRET_HEADER_NAME
from worker.backends.cloudtasks.contract import MAX_EXTRA_HEADER_BYTES, MAX_TASK_BODY_BYTES
from worker.backends.cloudtasks.settings import CloudTasksSettings
from worker.errors import ConfigError, QueueUnavailable
from worker.flow.delays import run_at_utc
from worker.producer import Job, envelope_body

#: Cloud Tasks schedules at most 30 days ahead.
MAX_DELAY_S = 30 * 24 * 3600


@dataclass(frozen=True)
class Created:
    """A created task's full name; ``created`` False when a task of that name existed (deduplicated)."""

    name: str
    created: bool = True


def task_id(idempotency_key: str) -> str:
    """The task id for an idempotency key (Cloud Tasks ids: letters, digits, ``-`` and ``_``, at most 500)."""
    return "key-" + hashlib.sha256(idempotency_key.encode("utf-8", "surrogatepass")).hexdigest()


def tasks_client(settings: CloudTasksSettings) -> Any:
    """A CloudTasksClient: the emulator at WORKER_CLOUDTASKS_EMULATOR_HOST (insecure gRPC), else Google's API
    with the application default credentials."""
    from google.cloud import tasks_v2

    if settings.emulator_host:
        import grpc
        from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

        channel = grpc.insecure_channel(settings.emulator_host)
        return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return tasks_v2.CloudTasksClient()
    except DefaultCredentialsError:
        raise ConfigError(
            "no Google credentials for Cloud Tasks: run on GCP with a service account, or `gcloud auth "
            "application-default login`, or set WORKER_CLOUDTASKS_EMULATOR_HOST for a local emulator"
        ) from None


def build_task(
    settings: CloudTasksSettings,
    queue_path: str,
    body: bytes,
    *,
    name: str | None = None,
    delay_s: float = 0,
    run_at: datetime | None = None,
    headers: dict[str, str] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The task (as the client's dict form) that delivers ``body`` to WORKER_CLOUDTASKS_URL, scheduled
    ``delay_s`` from ``now`` or at ``run_at`` (not both; a ``run_at`` in the past is due at once)."""
    from google.protobuf import duration_pb2, timestamp_pb2

    if not settings.url:
        raise ConfigError("WORKER_CLOUDTASKS_URL is not set: the URL of the serve-tasks service tasks go to")
    due_at = _due_at(delay_s, run_at, now or datetime.now(UTC))
    if len(body) > MAX_TASK_BODY_BYTES:
        raise ConfigError(
            f"the envelope takes {len(body)} bytes: a Cloud Tasks task holds at most 1 MB "
            f"({MAX_TASK_BODY_BYTES} bytes of body)"
        )
    extra_bytes = sum(len(k.encode()) + len(v.encode("utf-8", "surrogatepass")) for k, v in (headers or {}).items())
    if extra_bytes > MAX_EXTRA_HEADER_BYTES:
        raise ConfigError(
            f"the task's own headers take {extra_bytes} bytes, at most {MAX_EXTRA_HEADER_BYTES} fit beside a body "
            "at the limit (a requeue's --reason counts: shorten it)"
        )
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    request: dict[str, Any] = {"http_method": "POST", "url": settings.url, "headers": all_headers, "body": body}
    if settings.service_account:
        request["oidc_token"] = {
            "service_account_email": settings.service_account,
            "audience": settings.audience or settings.url,
        }
    elif settings.shared_secret:
        all_headers[SECRET_HEADER_NAME] = settings.shared_secret
    else:
        raise ConfigError("set WORKER_CLOUDTASKS_SERVICE_ACCOUNT (OIDC) or WORKER_CLOUDTASKS_SHARED_SECRET")
    task: dict[str, Any] = {
        "http_request": request,
        "dispatch_deadline": duration_pb2.Duration(seconds=settings.dispatch_deadline_s),
    }
    if name:
        task["name"] = f"{queue_path}/tasks/{name}"
    if due_at is not None:
        when = timestamp_pb2.Timestamp()
        when.FromDatetime(due_at)
        task["schedule_time"] = when
    return task


def _due_at(delay_s: float, run_at: datetime | None, now: datetime) -> datetime | None:
    """The task's ``schedule_time`` (None: at once); ConfigError past Cloud Tasks' 30 days, as for SQS's year."""
    if run_at is not None and delay_s:
        raise ConfigError("give delay_s or run_at, not both")
    if run_at is None:
        if not 0 <= delay_s <= MAX_DELAY_S:
            raise ConfigError(
                f"delay_s must be between 0 and {MAX_DELAY_S} (Cloud Tasks schedules up to 30 days ahead)"
            )
        return now + timedelta(seconds=delay_s) if delay_s else None
    due_at = run_at_utc(run_at)
    if (due_at - now).total_seconds() > MAX_DELAY_S:
        raise ConfigError(f"run_at must be at most {MAX_DELAY_S} s ahead (Cloud Tasks schedules up to 30 days ahead)")
    return due_at if due_at > now else None


def create_task(client: Any, settings: CloudTasksSettings, queue_path: str, task: dict[str, Any]) -> Created:
    """Create ``task``; one that exists by name already is reported (not created again)."""
    from google.api_core import exceptions as gexc

    try:
        response = client.create_task(parent=queue_path, task=task)
    except gexc.AlreadyExists:
        return Created(str(task.get("name", "")), created=False)
    except (gexc.NotFound, gexc.PermissionDenied, gexc.Unauthenticated, gexc.InvalidArgument) as exc:
        raise ConfigError(f"CreateTask on {queue_path}: {exc.message}") from exc
    except gexc.GoogleAPICallError as exc:
        raise QueueUnavailable(f"CreateTask on {queue_path}: {exc.message}") from exc
    except gexc.RetryError as exc:
        raise QueueUnavailable(f"CreateTask on {queue_path}: {exc}") from exc
    return Created(str(response.name))


def job_task(settings: CloudTasksSettings, queue: str, job: Job) -> tuple[str, dict[str, Any]]:
    """The queue path and the task of one job: named after its idempotency key when it has one."""
    if job.group_id is not None:
        raise ConfigError("Cloud Tasks queues have no message groups (--group-id is for SQS FIFO queues)")
    body = envelope_body(job).encode("utf-8")  # the SQS producer's checks (a lone surrogate: ConfigError)
    queue_path = settings.queue_path(queue)
    name = task_id(job.idempotency_key) if job.idempotency_key else None
    return queue_path, build_task(settings, queue_path, body, name=name, delay_s=job.delay_s, run_at=job.run_at)


def enqueue_task(client: Any, settings: CloudTasksSettings, queue: str, job: Job) -> Created:
    """Send one job as a task (what ``sqs-worker enqueue`` does with WORKER_BACKEND=cloudtasks). A typed
    ``.enqueue`` does not call it: it sends to SQS whatever WORKER_BACKEND says (README, Producers)."""
    queue_path, task = job_task(settings, queue, job)
    return create_task(client, settings, queue_path, task)
