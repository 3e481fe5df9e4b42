"""The dashboard's web app (Starlette, Jinja2 templates, uPlot charts served from the package: no CDN).

Pages: overview (``/``), dead letters (``/dead-letters``, a letter at ``/dead-letters/<id>``), jobs (``/jobs``),
schedules (``/schedules``), workers (``/workers``); ``/api/overview`` feeds the overview's live refresh.
Actions are POSTs that first answer with a confirmation page and act only when it is submitted (``confirmed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from worker.dashboard.config import DashboardSettings
from worker.dashboard.display import shown, shown_block
from worker.dashboard.history import History, columns
from worker.dashboard.security import CSRF_FIELD, TOKEN_COOKIE, Gate
from worker.dashboard.sources import READ_LIMIT, Sources, counts_of, describe_result
from worker.envelope import nests_deeper_than
from worker.errors import WorkerError
from worker.observability.logs import Redactor
from worker.ops.dlq_records import group_dead_letters, printable, printable_json
from worker.ops.stats import format_age

log = logging.getLogger("worker.dashboard")
HERE = Path(__file__).parent
#: A letter's body nesting deeper than this (more than any envelope the worker takes) is shown as the text it is.
BODY_MAX_DEPTH = 128
#: Rows of the messages table (the groups above count every letter read).
SHOWN_ROWS = 200
ACTIONS = {
    "requeue": "Requeue the selected dead letters",
    "requeue_group": "Requeue the dead letters read of this group",
    "redrive": "Redrive all dead letters to their queue",
    "purge": "Purge the dead-letter queue (cannot be undone)",
}


class Dashboard:
    """The app's state: settings, sources, access rules, sampled history, redaction."""

    def __init__(self, settings: DashboardSettings, sources: Sources, gate: Gate) -> None:
        self.settings = settings
        self.sources = sources
        self.gate = gate
        self.history = History()
        self._history_lock = threading.Lock()  # sampled in one thread, read by the requests' threads
        self.redactor = Redactor(settings.redact_fields)
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.filters["age"] = format_age
        self.templates.env.filters["printable"] = printable
        self.templates.env.filters["shown"] = shown
        self.templates.env.filters["shown_block"] = shown_block

    def render(self, request: Request, template: str, status_code: int = 200, /, **context: Any) -> Response:
        user = request.state.user
        context.update(
            user=user,
            csrf_field=CSRF_FIELD,
            csrf=self.gate.csrf_token(user),
            actions_enabled=self.gate.actions_enabled,
            queue=", ".join(self.sources.queue_names),
            queues=self.sources.queue_names,
            table=self.sources.table,
            page=template.removesuffix(".html"),
        )
        return self.templates.TemplateResponse(request, template, context, status_code=status_code)

    async def sample_forever(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.sample_once)
            except Exception as exc:  # an endpoint hiccup must not end the sampling
                log.warning("dashboard sample failed: %s", exc)
            await asyncio.sleep(self.settings.dashboard_sample_s)

    def sample_once(self) -> None:
        now_s = int(time.time())
        stats = self.sources.queues()
        workers = counts_of(self.sources.workers(), self.sources.queue_names) if self.sources.table else {}
        with self._history_lock:
            for row in stats:
                self.history.sample_depth(row.name, row.visible + row.in_flight + row.delayed, now_s=now_s)
            reported = self.history.sample_workers(workers, now_s=now_s)
            dead = sum(row.visible + row.in_flight for row in stats if row.role == "dlq")
            self.history.sample_dlq(dead, now_s=now_s, count_dead_letters=not reported)

    def overview(self) -> dict[str, Any]:
        now = datetime.now(UTC)
        stats = self.sources.queues()
        published = self.sources.published_series(now=now)
        with self._history_lock:
            series = published or self.history.series(now_s=int(now.timestamp()))
            depth = {name: [list(p) for p in points] for name, points in self.history.depth.items()}
        return {
            "queues": [{**asdict(row), "oldest": format_age(row.oldest_age_s)} for row in stats],
            "depth": depth,
            "series_source": "CloudWatch metrics" if published else "sampled by this dashboard",
            "series": columns(series),
        }

    def redact_body(self, body: str) -> str:
        """The whole body as the page shows it: indented JSON with secret fields redacted; the text as it came,
        redacted as log text is, when it is not JSON or not JSON the page walks (an integer of too many digits,
        nesting deeper than BODY_MAX_DEPTH or than Python's parser goes)."""
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return printable(self.redactor.redact_text(body))
        if nests_deeper_than(value, BODY_MAX_DEPTH):
            return printable(self.redactor.redact_text(body))
        return printable_json(self.redactor.redact(value, max_depth=BODY_MAX_DEPTH))


#: Every answer's: no framing (clickjacking), no scripts or styles from elsewhere, no address in a Referer.
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'",
    "Referrer-Policy": "no-referrer",
}


class AccessMiddleware(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await self._answer(request, call_next)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _answer(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        dashboard: Dashboard = request.app.state.dashboard
        if request.url.path == "/healthz":  # the load balancer's probe: no data, no token
            return PlainTextResponse("ok\n")
        query_token = request.query_params.get("token")
        user = dashboard.gate.identify(request.headers, request.cookies, query_token)
        if user is None:
            return PlainTextResponse("401 Unauthorized: a valid dashboard token is required\n", status_code=401)
        if query_token and user == "token":  # keep it in a cookie, out of the address bar and the history
            params = {k: v for k, v in request.query_params.items() if k != "token"}
            target = request.url.path + (f"?{urlencode(params)}" if params else "")
            response: Response = RedirectResponse(target, status_code=303)
            response.set_cookie(TOKEN_COOKIE, query_token, httponly=True, samesite="strict")
            return response
        request.state.user = user
        return await call_next(request)


def done_redirect(request: Request, path: str, notice: str) -> Response:
    """The 303 after an action, to ``path`` with its notice, signed so the page shows only notices it wrote."""
    signature = _dash(request).gate.notice_signature(notice)
    return RedirectResponse(f"{path}?{urlencode({'done': notice, 'sig': signature})}", status_code=303)


def done_notice(request: Request) -> str | None:
    """The notice of the redirect that led here, when this dashboard signed it (a crafted link's text is not
    shown)."""
    notice = request.query_params.get("done")
    if notice and _dash(request).gate.notice_ok(notice, request.query_params.get("sig")):
        return notice
    return None


def _dash(request: Request) -> Dashboard:
    dashboard: Dashboard = request.app.state.dashboard
    return dashboard


async def _checked_form(request: Request) -> FormData | Response:
    """The POST's form when its CSRF token is right and actions are enabled; else the 403 to answer."""
    dashboard = _dash(request)
    form = await request.form()
    offered = form.get(CSRF_FIELD)
    if not dashboard.gate.csrf_ok(request.state.user, offered if isinstance(offered, str) else None):
        return PlainTextResponse("403 Forbidden: missing or wrong CSRF token\n", status_code=403)
    if not dashboard.gate.actions_enabled:
        return PlainTextResponse(
            "403 Forbidden: the dashboard is read-only (WORKER_DASHBOARD_ACTIONS=true enables actions)\n",
            status_code=403,
        )
    return form


async def overview_page(request: Request) -> Response:
    data = await asyncio.to_thread(_dash(request).overview)
    return _dash(request).render(request, "overview.html", data=data)


async def overview_api(request: Request) -> Response:
    return JSONResponse(await asyncio.to_thread(_dash(request).overview))


def _matches(words: list[str], *texts: str | None) -> bool:
    haystack = " ".join(text or "" for text in texts).lower()
    return all(word in haystack for word in words)


async def dead_letters_page(request: Request) -> Response:
    dashboard = _dash(request)
    query = request.query_params.get("q", "").strip()
    words = query.lower().split()
    letters, audit, total = await asyncio.gather(
        asyncio.to_thread(dashboard.sources.dead_letters),
        asyncio.to_thread(dashboard.sources.audit_trail),
        asyncio.to_thread(dashboard.sources.dead_letter_total),
    )
    chosen = [
        q for q in letters if _matches(words, q.letter.error_message, q.letter.job_type, q.letter.category, q.queue)
    ]
    return dashboard.render(
        request,
        "dead_letters.html",
        query=query,
        letters=chosen,
        read=len(letters),
        total=total,
        read_limit=READ_LIMIT,
        shown_rows=SHOWN_ROWS,
        groups=group_dead_letters([q.letter for q in chosen]),
        lanes=dashboard.sources.lanes,
        audit=audit,
        done=done_notice(request),
    )


async def letter_page(request: Request) -> Response:
    dashboard = _dash(request)
    ident = request.path_params["message_id"]
    found = await asyncio.to_thread(dashboard.sources.find, ident, limit=500)
    if found is None:
        return dashboard.render(request, "letter.html", 404, letter=None, ident=ident)
    letter = found.letter
    described = letter.describe()
    attributes = {k: dashboard.redactor.redact_text(str(v)) for k, v in described.pop("message_attributes").items()}
    described.pop("body")
    return dashboard.render(
        request,
        "letter.html",
        letter=letter,
        source_queue=found.queue,
        ident=ident,
        described=described,
        attributes=attributes,
        body=dashboard.redact_body(letter.body),
    )


async def dead_letter_action(request: Request) -> Response:
    dashboard = _dash(request)
    form = await _checked_form(request)
    if isinstance(form, Response):
        return form
    action = str(form.get("action", ""))
    if action not in ACTIONS:
        return PlainTextResponse(f"400 Bad Request: unknown action {printable(action)!r}\n", status_code=400)
    ids = [str(i) for i in form.getlist("ids")]
    group = (str(form.get("category", "")), str(form.get("error", "")))
    reason = str(form.get("reason", "")).strip()
    if action == "requeue" and not ids:
        return PlainTextResponse("400 Bad Request: select at least one dead letter\n", status_code=400)
    sources = dashboard.sources
    lane = None
    if action == "purge":  # one queue's DLQ at a time, named on the confirmation page
        try:
            lane = sources.lane(str(form.get("queue", "")) or None)
        except WorkerError as exc:
            return PlainTextResponse(f"400 Bad Request: purge: {exc}\n", status_code=400)
    if form.get("confirmed") != "yes" or not reason:
        context = {"action": action, "title": ACTIONS[action], "ids": ids, "group": group, "reason": reason}
        if lane is not None:
            context["title"] = f"Purge {lane.dlq_name}, the dead-letter queue of {lane.name} (cannot be undone)"
        return dashboard.render(
            request, "confirm.html", 200, missing_reason=form.get("confirmed") == "yes", lane=lane, **context
        )
    user = request.state.user
    if lane is not None:
        count = await asyncio.to_thread(sources.purge, lane)
        outcome, detail = count, f"purged {lane.dlq_name} of {lane.name} (about {count} message(s))"
    else:
        if action == "redrive":
            result = await asyncio.to_thread(sources.redrive_all)
        else:
            chosen_group = group if action == "requeue_group" else None
            result = await asyncio.to_thread(sources.requeue, ids=ids, group=chosen_group, by=user, reason=reason)
        names = ", ".join(lane.dlq_name for lane in sources.lanes)  # a table shared by dashboards: say which DLQs
        outcome, detail = result.moved, f"{names}: {describe_result(result)}"
    log.info("dashboard action", extra={"event": "dashboard_action", "action": action, "by": user, "reason": reason})
    try:
        await asyncio.to_thread(sources.record_audit, who=user, action=action, why=reason, count=outcome, detail=detail)
    except WorkerError as exc:
        detail += f" (audit kept in memory only: {exc})"
    return done_redirect(request, "/dead-letters", f"{ACTIONS[action]}: {detail}")


async def jobs_page(request: Request) -> Response:
    dashboard = _dash(request)
    key = request.query_params.get("key", "").strip()
    sources = dashboard.sources
    workflow, record, failed, running = await asyncio.gather(  # a key names a workflow first, as in `status`
        asyncio.to_thread(sources.workflow, key) if key else asyncio.sleep(0, None),
        asyncio.to_thread(sources.job, key) if key else asyncio.sleep(0, None),
        asyncio.to_thread(sources.recent_jobs, "FAILED"),
        asyncio.to_thread(sources.recent_jobs, "IN_PROGRESS"),
    )
    now_ms = int(time.time() * 1000)
    result = None
    if workflow is not None:
        record = None
        if workflow.result is not None:
            result = printable_json(dashboard.redactor.redact(workflow.result))
    elif record is not None and record.result is not None:
        result = printable_json(dashboard.redactor.redact(record.result))
    return dashboard.render(
        request,
        "jobs.html",
        key=key,
        workflow=workflow,
        record=record,
        result=result,
        now_ms=now_ms,
        failed=failed,
        running=running,
        redact=dashboard.redactor.redact_text,
    )


async def schedules_page(request: Request) -> Response:
    from worker.scheduling.schedules import load_schedules

    dashboard = _dash(request)
    path = dashboard.settings.schedules_file
    schedules = load_schedules(path) if path else []
    now = datetime.now(UTC)
    rows = [(s, [t.astimezone(s.zone) for t in s.next_fire_times(now, 5)]) for s in schedules]
    return dashboard.render(request, "schedules.html", rows=rows, path=path, done=done_notice(request))


async def fire_schedule(request: Request) -> Response:
    from worker.ops.fire import send_scheduled, skip_note
    from worker.scheduling.schedules import find_schedule, format_scheduled_time, load_schedules

    dashboard = _dash(request)
    form = await _checked_form(request)
    if isinstance(form, Response):
        return form
    path = dashboard.settings.schedules_file
    try:
        schedule = find_schedule(load_schedules(path) if path else [], str(form.get("name", "")))
    except WorkerError as exc:
        return PlainTextResponse(f"404 Not Found: {exc}\n", status_code=404)
    reason = str(form.get("reason", "")).strip()
    if form.get("confirmed") != "yes" or not reason:
        return dashboard.render(
            request, "confirm.html", action="fire", title=f"Fire schedule {schedule.name} now", ids=[],
            group=("", ""), reason=reason, name=schedule.name, missing_reason=form.get("confirmed") == "yes",
        )  # fmt: skip
    now = datetime.now(UTC).replace(microsecond=0)
    scheduled = schedule.latest_fire_time(now) or now
    sources = dashboard.sources
    key = schedule.idempotency_key(scheduled)
    note = None
    if sources.table:  # read before the send, as `schedules fire` reads it
        record = await asyncio.to_thread(sources.job, key)
        note = skip_note(key, record, name=schedule.name, table=sources.table, now_ms=int(time.time() * 1000))
    message_id = await asyncio.to_thread(send_scheduled, sources.sqs, sources.queue_url, schedule, scheduled)
    detail = f"{schedule.name} fired for {format_scheduled_time(scheduled)}: message {message_id}"
    if note:
        detail += f"; {note}"
    with contextlib.suppress(WorkerError):
        await asyncio.to_thread(
            sources.record_audit, who=request.state.user, action="fire", why=reason, count=1, detail=detail
        )
    return done_redirect(request, "/schedules", detail)


async def workers_page(request: Request) -> Response:
    dashboard = _dash(request)
    workers = await asyncio.to_thread(dashboard.sources.workers)
    return dashboard.render(request, "workers.html", workers=workers)


def create_app(settings: DashboardSettings, sources: Sources, gate: Gate) -> Starlette:
    dashboard = Dashboard(settings, sources, gate)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.create_task(dashboard.sample_forever())
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

    app = Starlette(
        routes=[
            Route("/", overview_page),
            Route("/api/overview", overview_api),
            Route("/dead-letters", dead_letters_page),
            Route("/dead-letters/action", dead_letter_action, methods=["POST"]),
            Route("/dead-letters/{message_id}", letter_page),
            Route("/jobs", jobs_page),
            Route("/schedules", schedules_page),
            Route("/schedules/fire", fire_schedule, methods=["POST"]),
            Route("/workers", workers_page),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        middleware=[Middleware(AccessMiddleware)],
        lifespan=lifespan,
    )
    app.state.dashboard = dashboard
    return app
