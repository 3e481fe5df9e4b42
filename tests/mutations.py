"""Break the worker on purpose, one change at a time, and check that a test turns red for each breakage.

    .venv/bin/python -m tests.mutations            # every breakage; prints the table; exit 0 when all are caught
    .venv/bin/python -m tests.mutations a f --list # only some (by id), or just list them

Each breakage is a small textual patch of one file under worker/: ``old`` -> ``new``, where ``old`` must occur
exactly once (after ``within``, when given, and within ``WITHIN_LINES`` lines of it); ``also`` holds further
``(old, new)`` pairs of the same file, each found exactly once, for a breakage that takes two edits. When the
code moved and a snippet no longer matches, the breakage is reported as ``ANCHOR NOT FOUND`` (never as caught or
survived): re-anchor it, so that it breaks the same promise on today's code (the first error line in the table
says what the test saw: it must be the broken promise, not a crash). The patches are applied to a copy of the
working tree in a temporary folder, so the checkout is never modified, whatever happens (Ctrl-C included); the
chosen tests run there on moto, with ``-x`` and a time bound. A baseline run of every chosen test on the
unbroken copy comes first: it must be green.

Not a test module (pytest collects ``test_*.py`` only); not part of the normal test run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: How far below ``within`` the ``old`` snippet may start.
WITHIN_LINES = 30
IGNORED = (".git", ".venv", ".tools", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".terraform")


@dataclass(frozen=True)
class Breakage:
    id: str
    what: str
    path: str  # relative to the repository root, under worker/
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids expected to catch it, quickest first
    within: str | None = None  # a distinctive snippet that ``old`` follows (for a snippet that occurs twice)
    also: tuple[tuple[str, str], ...] = ()  # further (old, new) patches of the same file, each found once


BREAKAGES: tuple[Breakage, ...] = (
    Breakage(
        "a",
        "ack never deletes",
        "worker/runtime/outcomes.py",
        "await held.queue_or(self.queue).delete(held.message.receipt_handle)",
        "pass  # MUTANT",
        ("tests/test_runtime_basic.py::test_success_deletes_the_message",),
        within="async def ack(",
    ),
    Breakage(
        "b",
        "retry sets visibility 0 (the reported delay unchanged)",
        "worker/runtime/outcomes.py",
        "set_visibility(held.message.receipt_handle, delay_s)",
        "set_visibility(held.message.receipt_handle, 0)",
        ("tests/test_runtime_basic.py::test_retries_grow_then_exhaust_to_the_dlq",),
        within="async def retry(",
    ),
    Breakage(
        "c",
        "dead-letter drops the attributes",
        "worker/runtime/outcomes.py",
        "attributes=attributes,",
        "attributes=None,",
        ("tests/test_runtime_basic.py::test_bad_input_is_dead_lettered_with_its_category",),
        within="await self._dlq(held).send(",
    ),
    Breakage(
        "d",
        "heartbeat never extends (still reports a heartbeat)",
        "worker/runtime/heartbeat.py",
        "await held.queue_or(self.queue).set_visibility(held.message.receipt_handle, timeout_s)",
        "pass  # MUTANT",
        ("tests/test_runtime_claims.py::test_heartbeat_keeps_a_long_job_claimed",),
    ),
    Breakage(
        "e1",
        "shutdown does not release waiting (unstarted) messages",
        "worker/runtime/worker.py",
        "await self._release_all(waiting, reason=SHUTDOWN, delay_s=self._release_delay_s())",
        "pass  # MUTANT",
        ("tests/test_guards.py::test_shutdown_releases_unstarted_and_cancelled_messages",),
    ),
    Breakage(
        "e2",
        "shutdown does not release jobs cancelled after the grace period",
        "worker/runtime/processing.py",
        "await self.outcomes.hold_back(held, self._release_delay_s(), CANCELLED_AT_SHUTDOWN)",
        "pass  # MUTANT",
        (
            "tests/test_guards.py::test_shutdown_releases_unstarted_and_cancelled_messages",
            "tests/test_guards.py::test_a_release_at_shutdown_outlasts_the_abandoned_long_polls",
        ),
    ),
    Breakage(
        "e3",
        "shutdown releases at visibility 0 while its own abandoned long polls are still open at SQS",
        "worker/runtime/worker.py",
        "return max(0, math.ceil(self._abandoned_until - self.clock.monotonic()))",
        "return 0",
        ("tests/test_guards.py::test_a_release_at_shutdown_outlasts_the_abandoned_long_polls",),
    ),
    Breakage(
        "f",
        "delete-batch failures ignored",
        "worker/backends/sqs.py",
        "return _failures(response)",
        "return {}",
        ("tests/test_guards.py::test_a_refused_delete_is_reported_to_its_caller_alone",),
        within="async def _delete_batch(",
    ),
    Breakage(
        "g",
        "ledger completion skipped",
        "worker/runtime/processing.py",
        "fenced_ok = await self._complete_claim(held.claim, result_for_ledger(result))",
        "fenced_ok = True",
        ("tests/test_idempotency_runtime.py::test_an_idempotent_job_costs_two_writes",),
    ),
    Breakage(
        "h",
        "fencing token ignored (owner still checked)",
        "worker/idempotency/expressions.py",
        '"token_is_mine": Compare("token", "=", "token")',
        '"token_is_mine": Compare("owner", "=", "owner")',
        ("tests/test_idempotency_ledger.py::test_same_owner_name_with_an_old_token_is_fenced",),
    ),
    Breakage(
        "i1",
        "backoff without jitter (policy: always the full delay)",
        "worker/policy.py",
        "jitter = (rng or random).random()",
        "jitter = 1.0",
        ("tests/test_policy.py::test_backoff_spreads_a_burst",),
    ),
    Breakage(
        "i2",
        "backoff without jitter (the runtime ignores its random source)",
        "worker/runtime/processing.py",
        "max_attempts=job.spec.max_attempts, rng=self._rng",
        "max_attempts=job.spec.max_attempts, rng=random.Random(1)",
        ("tests/test_guards.py::test_retry_delays_are_drawn_from_the_workers_random_source",),
    ),
    Breakage(
        "j",
        "FIFO group not released after a failure",
        "worker/runtime/worker.py",
        "self._release_all(rest,",
        "self._release_all([],",
        ("tests/test_runtime_claims.py::test_fifo_order_holds_when_a_message_fails",),
    ),
    Breakage(
        "k1",
        "redrive limit ignored: bootstrap's maxReceiveCount",
        "worker/ops/bootstrap.py",
        '"maxReceiveCount": str(max_receive_count)',
        '"maxReceiveCount": "1000"',
        ("tests/test_guards.py::test_bootstrap_sets_the_redrive_policy_it_reports",),
    ),
    Breakage(
        "k2",
        "redrive limit ignored: dlq redrive moves past its --limit",
        "worker/ops/dlq.py",
        "target = snapshot.count if limit is None else min(limit, snapshot.count)",
        "target = snapshot.count  # MUTANT",
        ("tests/test_guards.py::test_a_redrive_moves_no_more_than_its_limit",),
    ),
    Breakage(
        "l",
        "a completed key runs again",
        "worker/runtime/processing.py",
        'if claim.outcome == "completed":',
        'if claim.outcome == "completed" and False:',
        ("tests/test_idempotency_runtime.py::test_a_duplicate_of_a_completed_job_is_acknowledged_without_running",),
    ),
    Breakage(
        "m1",
        "dlq redrive ignores its snapshot: moves until the DLQ is empty, dead-letters of the run again",
        "worker/ops/dlq.py",
        "target = snapshot.count if limit is None else min(limit, snapshot.count)",
        "target = 10**9 if limit is None else limit  # MUTANT",
        ("tests/test_redrive_snapshot.py::test_receive_send_delete_moves_the_snapshot_once",),
        also=(("if snapshot.admits(letter, moved=moved_ids)", "if True"),),
    ),
    Breakage(
        "m2",
        "dlq redrive admits what its snapshot excludes (its count still bounds the run)",
        "worker/ops/dlq.py",
        "if snapshot.admits(letter, moved=moved_ids)",
        "if True",
        ("tests/test_redrive_snapshot.py::test_a_copy_dead_lettered_again_never_moves_twice",),
    ),
    Breakage(
        "n1",
        "a failed dead-letter send runs the handler again (the error goes up, the decision is forgotten)",
        "worker/runtime/outcomes.py",
        "current = self._decided.get(message.message_id)",
        "self._decided.pop(message.message_id, None)\n                raise  # MUTANT",
        ("tests/test_hostile_input.py::test_a_failed_dead_letter_send_is_retried_as_a_send",),
    ),
    Breakage(
        "n2",
        "a copy of a message decided dead runs again (the runtime forgets the decision)",
        "worker/runtime/processing.py",
        "decided = self.outcomes.decided(message.message_id)",
        "decided = None  # MUTANT",
        ("tests/test_hostile_input.py::test_a_copy_of_a_dead_lettered_message_never_runs_again",),
    ),
    Breakage(
        "o",
        "shutdown releases a message whose plain def handler still runs in its thread",
        "worker/runtime/processing.py",
        "if self._threads.is_running(held):",
        "if False:  # MUTANT",
        ("tests/test_runtime_threads.py::test_shutdown_never_releases_a_sync_job_whose_thread_still_runs",),
    ),
    Breakage(
        "p",
        "a stuck sync thread still counts as capacity (no replacement thread)",
        "worker/runtime/threads.py",
        "and self._threads - self._stuck < self.size",
        "and self._threads < self.size  # MUTANT",
        (
            "tests/test_threads.py::test_an_overrunning_call_times_out_and_its_replacement_serves_the_next",
            "tests/test_runtime_threads.py::test_an_overrunning_sync_job_does_not_starve_the_next",
        ),
    ),
    Breakage(
        "dl1",
        "holds count as attempts (the attempt is SQS's receive count of the copy)",
        "worker/flow/attempts.py",
        "attempt = max(1, runs_before + approximate_receive_count - holds_here)",
        "attempt = approximate_receive_count  # MUTANT",
        (
            "tests/test_flow_policy.py::test_a_copy_carries_runs_and_receives_and_holds_cost_no_attempt",
            "tests/test_flow_delays.py::test_three_shutdown_holds_then_a_retryable_failure_still_get_every_attempt",
        ),
    ),
    Breakage(
        "dl2",
        "a job not yet due runs at once",
        "worker/flow/delays.py",
        '    if remaining_s <= 0:\n        return DueAction("run")',
        '    if True:  # MUTANT\n        return DueAction("run")',
        (
            "tests/test_flow_policy.py::test_due_action",
            "tests/test_flow_delays.py::test_a_long_delay_runs_once_after_its_due_time",
        ),
    ),
    Breakage(
        "ct1",
        "Cloud Tasks: the attempt misses the first dispatch (retry count taken as the attempt)",
        "worker/backends/cloudtasks/contract.py",
        "return self.retry_count + 1",
        "return max(1, self.retry_count)",
        ("tests/test_cloudtasks_http.py::test_last_attempt_is_dead_lettered_as_exhausted",),
    ),
    Breakage(
        "ct2",
        "Cloud Tasks: an OIDC token of any account is accepted",
        "worker/backends/cloudtasks/auth.py",
        'if claims.get("email") != self.service_account or claims.get("email_verified") is not True:',
        "if False:  # MUTANT",
        ("tests/test_cloudtasks_http.py::test_unauthenticated_requests_get_401_and_run_nothing",),
    ),
    Breakage(
        "ct3",
        "Cloud Tasks: a dead letter is answered 2xx without its record",
        "worker/backends/cloudtasks/runner.py",
        "await self.dead_letters.put_within(record, give_up_after_s=self.options.dead_letter_write_s)",
        "pass  # MUTANT",
        ("tests/test_cloudtasks_http.py::test_success_retry_delay_permanent_and_invalid_input",),
    ),
    Breakage(
        "ct4",
        "Cloud Tasks: the last attempt is refused when every slot is busy (Cloud Tasks would drop it)",
        "worker/backends/cloudtasks/runner.py",
        "if self._running >= self.options.concurrency and not last:",
        "if self._running >= self.options.concurrency:  # MUTANT",
        ("tests/test_cloudtasks_http.py::test_over_capacity_answers_503_but_the_last_attempt_waits",),
    ),
    Breakage(
        "ct5",
        "Cloud Tasks: a job's run_at is dropped (the task runs at once)",
        "worker/backends/cloudtasks/producer.py",
        "delay_s=job.delay_s, run_at=job.run_at)",
        "delay_s=job.delay_s)  # MUTANT",
        ("tests/test_cloudtasks_producer.py::test_run_at_is_the_schedule_time_within_30_days",),
    ),
    Breakage(
        "ct6",
        "Cloud Tasks: requeue puts its audit on the task unencoded (a non-Latin-1 reason is never delivered)",
        "worker/backends/cloudtasks/dlq.py",
        'AUDIT_HEADERS[name]: quote(value, safe=HEADER_SAFE, errors="surrogatepass")',
        "AUDIT_HEADERS[name]: value",  # MUTANT: the values as given
        (
            "tests/test_cloudtasks_requeue.py::test_audit_header_values_are_printable_ascii_and_decode_back",
            "tests/test_cloudtasks_requeue.py::test_a_non_latin1_reason_is_requeued_and_delivered",
        ),
    ),
    Breakage(
        "e4",
        "shutdown does not wait for a dead letter still being sent when its job was cancelled",
        "worker/runtime/worker.py",
        "        await self._finish_outcomes()\n",
        "        pass  # MUTANT\n",
        (
            "tests/test_shutdown_outcomes.py::test_a_dead_letter_in_flight_at_the_grace_deadline_is_finished_before_run_returns",
        ),
    ),
    Breakage(
        "h2",
        "a lost lease's cancellation of the job's task is not taken back (it looks like a shutdown's)",
        "worker/runtime/held.py",
        "                task.uncancel()\n",
        "                pass  # MUTANT\n",
        ("tests/test_idempotency_runtime.py::test_a_handler_whose_lease_is_taken_over_is_stopped",),
    ),
    Breakage(
        "q1",
        "a receive filling its batch is woken by every release (it then goes with the few slots left)",
        "worker/runtime/slots.py",
        "            budget -= wanted\n",
        "            pass  # MUTANT\n",
        ("tests/test_receive_loops.py::test_two_receives_filling_are_woken_one_batch_at_a_time",),
    ),
    Breakage(
        "q2",
        "when the first receive filling a batch gives up, the ones queued behind it give up too",
        "worker/runtime/slots.py",
        "            _resolve(timed)\n",
        "            for _, future, _ in self._fillers:  # MUTANT\n                _resolve(future)\n",
        ("tests/test_receive_loops.py::test_receives_queued_behind_the_first_filler_wait_their_own_turn",),
    ),
    Breakage(
        "p1",
        "prefetched messages start at once: more than the concurrency run",
        "worker/runtime/starts.py",
        "        if self._take():\n            self._start(item)\n",
        "        if True:  # MUTANT\n            self.running += 1\n            self._start(item)\n",
        ("tests/test_prefetch.py::test_prefetched_messages_are_held_but_at_most_the_concurrency_runs",),
    ),
    Breakage(
        "p2",
        "a job's end does not start the next prefetched message (it waits for nothing)",
        "worker/runtime/starts.py",
        "            self._start(turn)\n",
        "            pass  # MUTANT\n",
        ("tests/test_prefetch.py::test_a_prefetched_job_starts_when_one_ends_without_another_receive",),
    ),
    Breakage(
        "p3",
        "prefetched messages are kept at shutdown (not released: they reappear only after the visibility timeout)",
        "worker/runtime/worker.py",
        "        waiting = self._starts.close()  # prefetched, not started\n",
        "        self._starts.close()  # MUTANT\n        waiting = []\n",
        ("tests/test_prefetch.py::test_at_shutdown_prefetched_messages_go_back_at_once_unrun_and_uncounted",),
    ),
    Breakage(
        "p4",
        "a prefetched message whose claim lapsed while it waited is started anyway (another worker may hold it)",
        "worker/runtime/worker.py",
        "        if held.lost:\n",
        "        if False:  # MUTANT\n",
        ("tests/test_prefetch.py::test_a_prefetched_message_whose_claim_lapsed_is_not_started",),
    ),
    Breakage(
        "p5",
        "a prefetched message whose claim ran out unextended (SQS unreachable) is started anyway",
        "worker/runtime/worker.py",
        "        if not held.lost and held.claim_running_out(\n",
        "        if False and held.claim_running_out(  # MUTANT\n",
        ("tests/test_prefetch.py::test_a_prefetched_message_whose_claim_ran_out_unextended_is_not_started",),
    ),
    Breakage(
        "a1",
        "a message whose job ended here comes back before its delete went through and is run again",
        "worker/runtime/processing.py",
        "        if self.outcomes.acknowledged(message.message_id):\n",
        "        if False:  # MUTANT\n",
        ("tests/test_acknowledged_copies.py::test_a_copy_of_a_job_that_ended_here_is_deleted_not_run_again",),
    ),
    Breakage(
        "c1",
        "one failed call between successes reports SQS unreachable (readiness and logs flap on a flaky network)",
        "worker/runtime/connectivity.py",
        "    return now_s - failing_since_s >= UNREACHABLE_AFTER_S\n",
        "    return True  # MUTANT\n",
        ("tests/test_connectivity.py::test_failed_calls_between_successes_are_no_outage",),
    ),
    Breakage(
        "x1",
        "a handler's SystemExit (or KeyboardInterrupt, GeneratorExit) escapes its job and stops the worker",
        "worker/runtime/execution.py",
        '    with FailsTheJob("handler"):\n        return await _call_handler(',
        "    if True:  # MUTANT\n        return await _call_handler(",
        ("tests/test_handler_boundary.py::test_a_handler_exiting_fails_its_job_not_the_worker",),
    ),
    Breakage(
        "x2",
        "a downstream call's TimeoutError is reported as the handler running past its timeout_s",
        "worker/runtime/execution.py",
        "            if scope.expired():\n",
        "            if True:  # MUTANT\n",
        (
            "tests/test_handler_boundary.py::test_a_downstream_timeout_keeps_its_own_text_and_the_workers_names_timeout_s",
        ),
    ),
    Breakage(
        "x3",
        "an async handler's time left counts from before the middleware",
        "worker/runtime/execution.py",
        "        context.deadline_monotonic = time.monotonic() + timeout_s\n        scope = ",
        "        scope = ",
        ("tests/test_handler_boundary.py::test_time_left_counts_from_the_handlers_start_after_the_middleware",),
    ),
    Breakage(
        "s1",
        "a supervised process takes the process group's signal, passed on by the supervisor, as a second one",
        "worker/runtime/service.py",
        "    echo_s = SIGNAL_ECHO_S if supervised() else 0.0\n",
        "    echo_s = 0.0  # MUTANT\n",
        ("tests/test_processes.py::test_a_signal_to_the_whole_process_group_still_lets_running_jobs_finish",),
    ),
    Breakage(
        "r1",
        "a rate limit's interval is rounded up to a whole millisecond (500/s runs at 333/s)",
        "worker/flow/gcra.py",
        "        return max(0.001, round(self.period_s * 1000 / self.count * (1 + SPACING_MARGIN), 3))\n",
        "        return max(1, math.ceil(self.period_s * 1000 / self.count * (1 + SPACING_MARGIN)))  # MUTANT\n",
        ("tests/test_flow_limits_policy.py::test_a_fast_limit_keeps_its_rate_to_the_microsecond",),
        also=(("import re\n", "import math\nimport re\n"),),
    ),
    Breakage(
        "r2",
        "a hold behind a long backlog lies past the year a due time may name (the job is dead-lettered unrun)",
        "worker/flow/gate.py",
        "delay_s=min(MAX_HOLD_S, max(1, math.ceil(delay_ms / 1000)))",
        "delay_s=max(1, math.ceil(delay_ms / 1000))",
        ("tests/test_flow_limits_policy.py::test_a_hold_never_lies_beyond_a_day_even_behind_a_long_backlog",),
    ),
    Breakage(
        "f1",
        "a breaker's probe cancelled at shutdown keeps the breaker half-open for its whole lease",
        "worker/runtime/processing.py",
        "        await self._report_flow(held, Outcome.NOT_COUNTED)\n        if self._threads.is_running(held):\n",
        "        if self._threads.is_running(held):  # MUTANT\n",
        ("tests/test_flow_runtime.py::test_a_probe_cancelled_at_shutdown_is_given_back_for_the_next_job_to_probe",),
    ),
    Breakage(
        "w1",
        "a queue answering one for one at once gets one receive at a time (weighted shares drift toward even)",
        "worker/flow/priorities.py",
        "        return self.full and (self.last_asked >= 2 or self.last_prompt)\n",
        "        return self.full and self.last_asked >= 2  # MUTANT\n",
        ("tests/test_priorities.py::test_weighted_shares_hold_when_receives_take_longer_than_slots_take_to_free",),
    ),
    Breakage(
        "h1",
        "a supervisor's processes serve their health on every interface, not loopback",
        "worker/runtime/supervisor.py",
        '            WORKER_LISTEN_HOST="127.0.0.1",  # the supervisor alone answers from outside\n',
        "",
        ("tests/test_processes.py::test_a_killed_child_is_restarted_and_health_answers_for_the_group",),
    ),
    Breakage(
        "b1",
        "a burst long-polls WORKER_POLL_WAIT_S (its abandoned polls take jobs sent after it ended)",
        "worker/commands/core.py",
        "    settings = burst_settings(settings)\n",
        "",
        ("tests/test_burst.py::test_burst_on_an_empty_queue_exits_at_once",),
    ),
    Breakage(
        "u1",
        "invisible characters (zero-width space, BOM) printed raw by the dlq commands and the dashboard",
        "worker/ops/dlq_records.py",
        'INVISIBLE = "\\u00ad\\u180e\\u200b\\u2028\\u2029\\u2060-\\u2064\\ufeff"\n',
        'INVISIBLE = "\\u2028"  # MUTANT\n',
        ("tests/test_dlq_hostile.py::test_hostile_bodies_are_not_envelopes_and_print_safely",),
    ),
    Breakage(
        "d1",
        "the dashboard shows any notice a crafted ?done= link carries",
        "worker/dashboard/security.py",
        "        return bool(offered) and hmac.compare_digest(str(offered), self.notice_signature(text))\n",
        "        return True  # MUTANT\n",
        ("tests/test_dashboard_browser.py::test_a_notice_in_a_crafted_link_is_not_shown",),
    ),
    Breakage(
        "d2",
        "the dashboard's 401 and ?token= redirect lack the frame and CSP headers",
        "worker/dashboard/app.py",
        "        response.headers.update(SECURITY_HEADERS)\n",
        "        if response.status_code == 200:  # MUTANT\n            response.headers.update(SECURITY_HEADERS)\n",
        ("tests/test_dashboard_browser.py::test_every_answer_carries_the_frame_and_script_headers",),
    ),
    Breakage(
        "r3",
        "run says nothing of a FIFO queue whose maxReceiveCount is too low for rate-limited jobs' holds",
        "worker/runtime/assemble.py",
        "    elif held and receives < FIFO_FLOW_RECEIVE_COUNT:\n",
        "    elif held and receives < 0:  # MUTANT\n",
        ("tests/test_start_checks.py::test_a_fifo_queue_too_low_for_held_jobs_is_named_at_start",),
    ),
    Breakage(
        "v1",
        "a misspelt WORKER_DASHBOARD_TOKEN is not warned about (the dashboard family unjudged)",
        "worker/settings.py",
        'UNJUDGED_FAMILIES = ("WORKER_WEBHOOK_", "WORKER_EMAIL_", "WORKER_REPORT_")\n',
        'UNJUDGED_FAMILIES = ("WORKER_WEBHOOK_", "WORKER_EMAIL_", "WORKER_REPORT_", "WORKER_DASHBOARD_")  # MUTANT\n',
        ("tests/test_settings_sources.py::test_unknown_worker_variables_are_named_with_the_setting_they_misspell",),
    ),
    Breakage(
        "x4",
        "a handler's BaseException other than SystemExit, KeyboardInterrupt, GeneratorExit escapes the retry rules",
        "worker/errors.py",
        "if exc is None or isinstance(exc, Exception | asyncio.CancelledError):",
        "if exc is None or not isinstance(exc, SystemExit | KeyboardInterrupt | GeneratorExit):  # MUTANT",
        ("tests/test_handler_boundary.py::test_a_handler_exiting_fails_its_job_not_the_worker",),
    ),
    Breakage(
        "x5",
        "a middleware's SystemExit stops the worker (not wrapped as the job's failure)",
        "worker/middleware.py",
        '    with FailsTheJob("middleware"):\n        result = await _call_chain(',
        "    if True:  # MUTANT\n        result = await _call_chain(",
        ("tests/test_handler_boundary.py::test_a_middleware_exiting_fails_its_job_not_the_worker",),
    ),
    Breakage(
        "x6",
        "a middleware's un-awaited call_next() makes the job succeed without its handler",
        "worker/middleware.py",
        "    if inspect.isawaitable(result):\n",
        "    if False:  # MUTANT\n",
        ("tests/test_handler_boundary.py::test_a_middleware_returning_call_next_unawaited_is_a_bug_not_a_success",),
    ),
    Breakage(
        "t1",
        "Cloud Tasks: a running job's lease is not renewed",
        "worker/backends/cloudtasks/runner.py",
        "        renewing = asyncio.create_task(self._keep_lease(request, claim, name)) if claim is not None else "
        "None\n",
        "        renewing = None  # MUTANT\n",
        ("tests/test_cloudtasks_faults.py::test_a_running_jobs_lease_is_short_and_renewed",),
    ),
    Breakage(
        "t2",
        "Cloud Tasks: a redelivery does not record the completion its first delivery could not write",
        "worker/backends/cloudtasks/runner.py",
        "        if request.task_name in self._unrecorded:  # it ran here; its completion is what is missing\n",
        "        if False:  # MUTANT\n",
        (
            "tests/test_cloudtasks_faults.py::test_a_completion_not_recorded_is_recorded_by_the_redelivery_without_running_again",
        ),
    ),
    Breakage(
        "t3",
        "Cloud Tasks: a last attempt cancelled at shutdown is answered 503 (Cloud Tasks drops it, no record)",
        "worker/backends/cloudtasks/runner.py",
        "                if last:  # Cloud Tasks would drop it: keep it as a dead letter\n",
        "                if False:  # MUTANT\n",
        ("tests/test_cloudtasks_faults.py::test_a_last_attempt_cancelled_at_shutdown_is_kept_as_a_dead_letter",),
    ),
    Breakage(
        "t4",
        "Cloud Tasks: after a failed key fetch every request fetches again (no pause)",
        "worker/backends/cloudtasks/auth.py",
        "        if self._failed_at is not None and now - self._failed_at < RETRY_AFTER_FAILURE_S:\n",
        "        if False:  # MUTANT\n",
        ("tests/test_cloudtasks_units.py::test_concurrent_requests_share_one_key_fetch_and_a_failure_pauses_fetching",),
    ),
    Breakage(
        "b2",
        "a burst gives up on jobs its own rate limit held back",
        "worker/runtime/burst.py",
        "        elif event.kind is Kind.RELEASED and event.reason not in NOT_AWAITED:\n",
        "        elif False:  # MUTANT\n",
        ("tests/test_burst.py::test_burst_waits_for_the_jobs_its_own_rate_limit_held_back",),
    ),
    Breakage(
        "s2",
        "schedules fire --now keys to the second (two fires in a second share a key)",
        "worker/commands/schedules.py",
        "    return now.replace(microsecond=now.microsecond // 1000 * 1000)\n",
        "    return now.replace(microsecond=0)  # MUTANT\n",
        ("tests/test_schedules_fire_ledger.py::test_fire_says_a_done_slot_is_skipped_and_now_fires_a_fresh_run",),
    ),
    Breakage(
        "g1",
        "one worker's counted failures of a key write at once: refused by each other, 10 count as 4",
        "worker/flow/gate.py",
        "        async with lock:\n            return await self._change_locked(key, job_type, change)\n",
        "        return await self._change_locked(key, job_type, change)  # MUTANT\n",
        ("tests/test_flow_gate_races.py::test_concurrent_counted_failures_of_one_worker_are_all_counted",),
    ),
    Breakage(
        "g2",
        "a breaker write that landed but whose answer was lost is refused on its retry and applied again",
        "worker/flow/store.py",
        '        if not result.ok and not (result.item is not None and result.item.get("write_id") == write_id):\n',
        "        if not result.ok:  # MUTANT\n",
        ("tests/test_flow_gate_races.py::test_dynamo_one_counted_failure_whose_answer_is_lost_counts_once",),
    ),
    Breakage(
        "g3",
        "a new breaker item counts versions from 0: a record of the item a reset deleted passes its version check",
        "worker/flow/gate.py",
        "    return secrets.randbelow(FIRST_VERSIONS)\n",
        "    return 0  # MUTANT\n",
        (
            "tests/test_flow_gate_races.py::test_a_reset_is_not_undone_by_a_worker_whose_cached_version_the_new_item_reached_again",
        ),
    ),
    Breakage(
        "g4",
        "a probe write that landed and then failed is not given back (the key waits out the probe's lease)",
        "worker/flow/gate.py",
        "                with contextlib.suppress(Exception):\n                    await asyncio.shield(give_back)\n",
        "                give_back.close()  # MUTANT\n",
        ("tests/test_flow_gate_races.py::test_a_probe_write_that_raises_after_landing_does_not_leave_a_ghost_probe",),
    ),
    Breakage(
        "g5",
        "an answer that overlapped a newer one replaces it (the worker that opened its breaker runs its jobs)",
        "worker/flow/gate.py",
        "        if kept is not None and (record is None or record.version <= kept.version):\n",
        "        if kept is not None and False:  # MUTANT\n",
        (
            "tests/test_flow_gate_races.py::test_a_read_sent_before_the_opening_write_but_answered_after_it_does_not_reclose_the_breaker",
        ),
    ),
    Breakage(
        "g6",
        "a probe that succeeded but whose completion the ledger could not record leaves its breaker half-open",
        "worker/runtime/processing.py",
        (
            "        await self._settle_success(held, job, result, duration_s)\n"
            "        await self._report_flow(held, Outcome.SUCCEEDED)\n"
        ),
        "        await self._settle_success(held, job, result, duration_s)  # MUTANT\n",
        (
            "tests/test_flow_runtime.py::"
            "test_a_probe_that_succeeded_closes_its_breaker_though_the_ledger_could_not_record_it",
        ),
        also=(
            (
                (
                    "        await self.outcomes.ack(held)\n"
                    "        self._emit(Kind.SUCCEEDED, held, duration_s=duration_s)\n"
                    "\n"
                    "    async def _complete_claim"
                ),
                (
                    "        await self.outcomes.ack(held)\n"
                    "        self._emit(Kind.SUCCEEDED, held, duration_s=duration_s)\n"
                    "        await self._report_flow(held, Outcome.SUCCEEDED)\n"
                    "\n"
                    "    async def _complete_claim"
                ),
            ),
        ),
    ),
    Breakage(
        "s3",
        "a SIGTERM while the supervisor starts a child passes it by (killed at the grace's end, jobs run again)",
        "worker/runtime/supervisor.py",
        "            if self.stop.is_set():  # stopped while it was being started: the signal passed it by\n",
        "            if False:  # MUTANT\n",
        ("tests/test_processes.py::test_a_signal_while_a_child_is_being_started_reaches_it",),
    ),
    Breakage(
        "s4",
        "a restarted child keeps the loopback port of its last start (taken meanwhile: the group stops with 2)",
        "worker/runtime/supervisor.py",
        "                await asyncio.wait_for(self.stop.wait(), delay_s)\n            self._pick_ports(child)\n",
        "                await asyncio.wait_for(self.stop.wait(), delay_s)  # MUTANT\n",
        ("tests/test_processes.py::test_a_restarted_child_gets_ports_of_its_own_when_its_old_one_is_taken",),
    ),
    Breakage(
        "o1",
        "a held job's copy is tried once: a transport failure releases it in place (a receive toward maxReceiveCount)",
        "worker/runtime/outcomes.py",
        "                if wait_s is None:\n",
        "                if True:  # MUTANT\n",
        ("tests/test_hold_copies.py::test_a_copy_that_failed_twice_is_sent_again_and_the_original_deleted",),
    ),
    Breakage(
        "o2",
        "a job whose claim answers after SIGTERM starts its handler",
        "worker/runtime/processing.py",
        "        if self._stopping():  # the signal came while the gate or the ledger answered: give both back\n",
        "        if False:  # MUTANT\n",
        ("tests/test_idempotency_runtime.py::test_a_job_whose_claim_answers_after_sigterm_is_put_back_not_started",),
    ),
    Breakage(
        "d9",
        "the dashboard parses a dead letter's body without catching RecursionError (HTTP 500 on a deep body)",
        "worker/dashboard/app.py",
        "        except (ValueError, RecursionError):\n            return printable(self.redactor.redact_text(body))\n",
        "        except ValueError:  # MUTANT\n            return printable(self.redactor.redact_text(body))\n",
        (
            "tests/test_dashboard_layout.py::test_a_deep_body_is_shown_whole_and_a_narrow_window_scrolls_tables_not_errors",
        ),
    ),
    Breakage(
        "s5",
        "a supervised process ignores repeats of its stop signal even once the supervisor is gone",
        "worker/runtime/service.py",
        "            if parent_pid is not None and os.getppid() == parent_pid:\n",
        "            if parent_pid is not None:  # MUTANT\n",
        ("tests/test_processes.py::test_once_the_supervisor_is_gone_a_second_sigterm_ends_a_process_at_once",),
    ),
    Breakage(
        "s6",
        "the supervisor passes a second signal on as the signal itself (taken as the first arriving again)",
        "worker/runtime/supervisor.py",
        "        self._signal_all(EXIT_NOW_SIGNAL)\n",
        "        self._signal_all(signum)  # MUTANT\n",
        ("tests/test_processes.py::test_a_second_sigterm_ends_the_group_at_once_with_143",),
    ),
    Breakage(
        "s7",
        "a supervised process takes a late repeat of the group's signal as a second signal",
        "worker/runtime/service.py",
        "            if parent_pid is not None and os.getppid() == parent_pid:\n",
        "            if parent_pid is not None and os.getppid() == parent_pid and False:  # MUTANT\n",
        ("tests/test_processes.py::test_a_starved_supervisors_late_copy_of_the_group_signal_is_not_a_second_signal",),
    ),
)


@dataclass
class Outcome:
    breakage: Breakage
    result: str  # CAUGHT, SURVIVED, ANCHOR NOT FOUND, TIMEOUT, ERROR
    caught_by: str = ""
    seconds: float = 0.0


def apply(text: str, breakage: Breakage) -> str:
    """The text with the breakage applied. Raises LookupError naming the snippet that did not match once."""
    start, end = 0, len(text)
    if breakage.within is not None:
        if text.count(breakage.within) != 1:
            raise LookupError(f"`within` snippet {breakage.within!r} found {text.count(breakage.within)} times")
        start = text.index(breakage.within)
        end = start
        for _ in range(WITHIN_LINES):
            end = text.find("\n", end + 1)
            if end < 0:
                end = len(text)
                break
        index = text.find(breakage.old, start, end)
        if index < 0:
            raise LookupError(f"{breakage.old!r} not found within {WITHIN_LINES} lines after {breakage.within!r}")
    else:
        count = text.count(breakage.old)
        if count != 1:
            raise LookupError(f"{breakage.old!r} found {count} times (must be exactly once)")
        index = text.index(breakage.old)
    text = text[:index] + breakage.new + text[index + len(breakage.old) :]
    for old, new in breakage.also:
        count = text.count(old)
        if count != 1:
            raise LookupError(f"{old!r} found {count} times (must be exactly once)")
        text = text.replace(old, new)
    return text


def copy_tree(destination: Path) -> Path:
    tree = destination / "tree"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(*IGNORED))
    tools = ROOT / ".tools"
    if tools.exists():  # LocalStack's own virtualenv, should a run choose that backend
        (tree / ".tools").symlink_to(tools.resolve())
    return tree


def run_pytest(tree: Path, tests: Sequence[str], timeout_s: float) -> tuple[int | None, str]:
    """Run ``tests`` in ``tree``: (pytest's exit code or None on timeout, its output)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.setdefault("SQS_WORKER_TEST_BACKENDS", "moto")
    command = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-rfE", "-p", "no:cacheprovider"]
    process = subprocess.Popen(
        command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        _kill(process)
        return None, ""
    except BaseException:  # Ctrl-C: take the whole pytest process group down with us
        _kill(process)
        raise


def _kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def first_failure(output: str) -> str:
    """The first failed test and the first line of its error, as pytest's output names them."""
    test = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    error = re.search(r"^E +(.+)$", output, re.MULTILINE)
    why = error.group(1).strip()[:100] if error else ""
    return (test.group(1) if test else "?") + (f" ({why})" if why else "")


def try_breakage(tree: Path, breakage: Breakage, timeout_s: float) -> Outcome:
    target = tree / breakage.path
    original = target.read_text(encoding="utf-8")
    try:
        broken = apply(original, breakage)
    except LookupError as exc:
        return Outcome(breakage, "ANCHOR NOT FOUND", str(exc))
    started = time.monotonic()
    target.write_text(broken, encoding="utf-8")
    try:
        code, output = run_pytest(tree, breakage.tests, timeout_s)
    finally:
        target.write_text(original, encoding="utf-8")
    seconds = time.monotonic() - started
    if code is None:
        return Outcome(breakage, "TIMEOUT", f"no verdict within {timeout_s:g} s", seconds)
    if code == 1:
        return Outcome(breakage, "CAUGHT", first_failure(output), seconds)
    if code == 0:
        return Outcome(breakage, "SURVIVED", "", seconds)
    tail = " | ".join(output.strip().splitlines()[-3:])
    return Outcome(breakage, "ERROR", f"pytest exit {code}: {tail}", seconds)


def table(outcomes: Sequence[Outcome]) -> str:
    rows = ["| id | breakage | file | result | caught by | s |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        b = o.breakage
        caught_by = o.caught_by.replace("|", "\\|")
        rows.append(f"| {b.id} | {b.what} | {b.path} | {o.result} | {caught_by} | {o.seconds:.0f} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutations", description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*", help="breakage ids to try (default: all)")
    parser.add_argument("--list", action="store_true", help="list the breakages and exit")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="time bound of each pytest run (240)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the green run of the unbroken copy")
    parser.add_argument("--tests", nargs="+", metavar="NODE", help="run these tests for every breakage instead")
    args = parser.parse_args(argv)
    chosen = [b for b in BREAKAGES if not args.ids or b.id in args.ids]
    if args.tests:
        chosen = [dataclasses.replace(b, tests=tuple(args.tests)) for b in chosen]
    unknown = set(args.ids) - {b.id for b in BREAKAGES}
    if unknown:
        parser.error(f"unknown breakage id(s): {', '.join(sorted(unknown))}")
    if args.list:
        for b in chosen:
            print(f"{b.id:3} {b.what}  [{b.path}]  -> {', '.join(b.tests)}")
        return 0
    outcomes: list[Outcome] = []
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM cleans up as Ctrl-C does
    with tempfile.TemporaryDirectory(prefix="sqs-worker-mutants-") as scratch:
        tree = copy_tree(Path(scratch))
        try:
            if not args.no_baseline:
                tests = list(dict.fromkeys(t for b in chosen for t in b.tests))
                print(f"baseline: {len(tests)} test(s) on the unbroken copy ...", flush=True)
                code, output = run_pytest(tree, tests, args.timeout_s * 2)
                if code != 0:
                    print(output[-4000:] or "(timed out)")
                    print(f"baseline is not green (exit {code}): fix the tests before judging breakages")
                    return 2
            for b in chosen:
                outcome = try_breakage(tree, b, args.timeout_s)
                outcomes.append(outcome)
                print(f"{b.id:3} {outcome.result:16} {b.what}  {outcome.caught_by}", flush=True)
        except KeyboardInterrupt:
            print("interrupted; the checkout was never modified", file=sys.stderr)
            if outcomes:
                print(table(outcomes))
            return 130
    print()
    print(table(outcomes))
    return 0 if all(o.result == "CAUGHT" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
