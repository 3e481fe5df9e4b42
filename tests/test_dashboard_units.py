"""The dashboard's pure parts: who may look and act (token, ALB OIDC, CSRF, exposure), and what it samples."""

from __future__ import annotations

import pytest

from worker.dashboard.history import History, columns
from worker.dashboard.security import Gate, check_exposure, is_loopback
from worker.dashboard.sources import WorkerInfo, counts_of
from worker.errors import ConfigError

LOOPBACK = [("127.0.0.1", True), ("::1", True), ("localhost", True)]
ELSEWHERE = [("0.0.0.0", False), ("10.0.3.7", False), ("dash.internal", False)]


@pytest.mark.parametrize(("host", "loopback"), LOOPBACK + ELSEWHERE)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_listening_beyond_loopback_needs_a_token_or_alb_oidc() -> None:
    check_exposure(host="127.0.0.1", token=None, trust_alb_oidc=False)
    check_exposure(host="0.0.0.0", token="t", trust_alb_oidc=False)
    check_exposure(host="0.0.0.0", token=None, trust_alb_oidc=True)
    with pytest.raises(ConfigError, match="WORKER_DASHBOARD_TOKEN"):
        check_exposure(host="0.0.0.0", token=None, trust_alb_oidc=False)


def test_a_token_gate_admits_the_bearer_the_cookie_or_the_query_and_nothing_else() -> None:
    gate = Gate.create(token="s3cret", trust_alb_oidc=False, actions_enabled=False)
    assert gate.identify({"authorization": "Bearer s3cret"}, {}, None) == "token"
    assert gate.identify({}, {"sqs_worker_dashboard": "s3cret"}, None) == "token"
    assert gate.identify({}, {}, "s3cret") == "token"
    assert gate.identify({"authorization": "Bearer wrong"}, {}, None) is None
    assert gate.identify({}, {}, None) is None
    assert gate.identify({"x-amzn-oidc-identity": "ada"}, {}, None) is None  # not trusted unless told


def test_alb_oidc_identifies_the_user_by_its_header() -> None:
    gate = Gate.create(token=None, trust_alb_oidc=True, actions_enabled=True)
    assert gate.identify({"x-amzn-oidc-identity": "ada@example.com"}, {}, None) == "oidc:ada@example.com"
    assert gate.identify({}, {}, None) is None


def test_with_a_token_set_the_oidc_header_names_the_user_but_never_replaces_the_token() -> None:
    """Token and ALB OIDC together: a forged x-amzn-oidc-identity without the token got in, actions and all."""
    gate = Gate.create(token="s3cret", trust_alb_oidc=True, actions_enabled=True)
    assert gate.identify({"x-amzn-oidc-identity": "mallory"}, {}, None) is None
    both = {"x-amzn-oidc-identity": "ada@example.com", "authorization": "Bearer s3cret"}
    assert gate.identify(both, {}, None) == "oidc:ada@example.com"
    assert gate.identify({"authorization": "Bearer s3cret"}, {}, None) == "token"


def test_csrf_tokens_are_per_user_and_per_process() -> None:
    gate = Gate.create(token=None, trust_alb_oidc=False, actions_enabled=True)
    other = Gate.create(token=None, trust_alb_oidc=False, actions_enabled=True)
    token = gate.csrf_token("ada")
    assert gate.csrf_ok("ada", token)
    assert not gate.csrf_ok("bob", token)
    assert not gate.csrf_ok("ada", None)
    assert not gate.csrf_ok("ada", "")
    assert not other.csrf_ok("ada", token)  # a restarted dashboard refuses old pages' forms


def test_history_counts_what_each_worker_did_between_samples() -> None:
    history = History()
    assert history.sample_workers({"a": {"succeeded": 10, "retried": 1}}, now_s=1000)  # baseline, not counted
    history.sample_workers({"a": {"succeeded": 14, "retried": 1}, "b": {"succeeded": 3}}, now_s=1010)
    later = {"a": {"succeeded": 15, "retried": 2, "dead_lettered": 1}, "b": {"succeeded": 5}}
    history.sample_workers(later, now_s=1070)
    series = history.series(now_s=1070)
    assert series["succeeded"] == [(960, 4.0), (1020, 3.0)]
    assert series["retried"] == [(960, 0.0), (1020, 1.0)]
    assert series["dead_lettered"] == [(960, 0.0), (1020, 1.0)]
    assert not history.sample_workers({}, now_s=1080)


def test_history_counts_dlq_growth_only_when_no_worker_reports() -> None:
    history = History()
    history.sample_dlq(2, now_s=0, count_dead_letters=True)
    history.sample_dlq(5, now_s=30, count_dead_letters=True)
    history.sample_dlq(1, now_s=40, count_dead_letters=True)  # redriven: not negative
    history.sample_dlq(4, now_s=50, count_dead_letters=False)  # the workers' counts have it
    assert history.series(now_s=50)["dead_lettered"] == [(0, 3.0)]


def test_history_keeps_one_hour() -> None:
    history = History()
    for minute in range(90):
        history.sample_depth("q", minute, now_s=minute * 60)
        history.sample_dlq(minute, now_s=minute * 60, count_dead_letters=True)
    assert history.depth["q"][0] == (29 * 60, 29)
    assert min(history.series(now_s=89 * 60)["dead_lettered"])[0] == 29 * 60


def test_columns_line_the_series_up_on_one_time_axis() -> None:
    out = columns({"succeeded": [(60, 2.0)], "retried": [(0, 1.0)], "dead_lettered": []})
    assert out == {"t": [0.0, 60.0], "succeeded": [0.0, 2.0], "retried": [1.0, 0.0], "dead_lettered": [0.0, 0.0]}


def test_the_overview_counts_only_the_workers_of_its_queues() -> None:
    def info(owner: str, queue: str, succeeded: int) -> WorkerInfo:
        return WorkerInfo(owner, queue, "host", 4, 0, {"succeeded": succeeded}, 1.0)

    workers = [
        info("a", "jobs", 3),
        info("b", "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs", 2),  # WORKER_QUEUE given as a URL
        info("c", "flows", 10),  # another queue's worker sharing the table
        info("d", "jobs-archive", 7),
    ]
    assert counts_of(workers, ["jobs"]) == {"a": {"succeeded": 3}, "b": {"succeeded": 2}}
    assert set(counts_of(workers, ["jobs", "flows"])) == {"a", "b", "c"}
