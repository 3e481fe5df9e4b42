"""The container image, checked without a Docker engine (none exists on these machines).

The Dockerfile is parsed and held to its contract (pinned slim base, locked install, non-root numeric user,
exec-form entrypoint and healthcheck, read-only-root friendly environment); every file it copies must exist
and survive .dockerignore; hadolint lints it; and the runtime venv is built the way the image builds it
(``uv sync --frozen --no-default-groups --no-editable``) so its console script is run for real.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.observability.health import write_liveness_file
from worker.settings import WorkerSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
WORKFLOW_FILE = REPO_ROOT / ".github" / "workflows" / "ci.yml"
HADOLINT = REPO_ROOT / ".tools" / "hadolint-venv" / "bin" / "hadolint"
PYTHON_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?$")
#: An exact version tag (major.minor.patch, optionally a variant like -slim-bookworm), optionally a digest.
EXACT_TAG = re.compile(r"^[\w./-]+:\d+\.\d+\.\d+(-[\w.-]+)?(@sha256:[0-9a-f]{64})?$")


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def one(self, keyword: str) -> str:
        (args,) = self.all(keyword)
        return args


def logical_lines(text: str) -> list[str]:
    """Dockerfile lines with comments dropped and backslash continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append((pending + stripped).strip())
        pending = ""
    assert not pending, "dangling line continuation at the end of the Dockerfile"
    return lines


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with ${ARG} substituted in FROM."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest).split()
            words = [w for w in words if not w.startswith("--platform")]
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], alias))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"not exec (JSON array) form: {args}"
    assert all(isinstance(part, str) for part in value)
    return value


def env_values(stage: Stage) -> dict[str, str]:
    values: dict[str, str] = {}
    for args in stage.all("ENV"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            values[key] = value
    return values


def dockerignore_keeps(path: str, patterns: list[str]) -> bool:
    """Whether the build context keeps ``path``: the last matching pattern (or one of a parent dir) decides."""
    keep = True
    for pattern in patterns:
        if _ignore_pattern_matches(pattern.lstrip("!").strip("/"), path.split("/")):
            keep = pattern.startswith("!")
    return keep


def _ignore_pattern_matches(body: str, parts: list[str]) -> bool:
    if body == "**":
        return True
    if body.startswith("**/"):
        return any(fnmatch.fnmatchcase(part, body[3:]) for part in parts)
    return any(fnmatch.fnmatchcase("/".join(parts[: n + 1]), body) for n in range(len(parts)))


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))[1]


@pytest.fixture(scope="module")
def runtime(stages: list[Stage]) -> Stage:
    return stages[-1]


def test_images_are_pinned_and_the_runtime_is_the_slim_python_base(stages: list[Stage]) -> None:
    for stage in stages:
        assert EXACT_TAG.match(stage.image), f"unpinned base image {stage.image}"
    assert PYTHON_BASE.match(stages[-1].image)
    python_stages = [stage for stage in stages if stage.image.startswith("python:")]
    assert len({stage.image for stage in python_stages}) == 1, "builder and runtime must share one base"


def test_image_and_workflow_use_one_uv_version(stages: list[Stage]) -> None:
    uv_stage = next(stage for stage in stages if stage.image.startswith("ghcr.io/astral-sh/uv:"))
    workflow = yaml.safe_load(WORKFLOW_FILE.read_text(encoding="utf-8"))
    assert uv_stage.image.split(":")[1] == workflow["env"]["UV_VERSION"]


def test_builder_installs_the_locked_runtime_set_only(stages: list[Stage]) -> None:
    builder = next(stage for stage in stages if stage.name == "builder")
    installs = [run for run in builder.all("RUN") if "uv sync" in run]
    assert installs
    for run in installs:
        assert "--frozen" in run, "must install exactly uv.lock"
        assert "--no-default-groups" in run, "the test dependency group must stay out of the image"
        assert "--no-editable" in run, "the runtime stage copies the venv, not the source"
        assert "--all-extras" not in run
        assert "--extra dashboard" in run, "the image runs `sqs-worker dashboard` too"
        assert "--extra uvloop" in run, "WORKER_EVENT_LOOP=uvloop works in the image"
        rest = run.replace("--extra dashboard", "").replace("--extra uvloop", "")
        assert "--extra" not in rest, "only the dashboard and uvloop extras (not moto's dev)"


def test_runtime_runs_as_a_numeric_non_root_user(runtime: Stage) -> None:
    user = runtime.one("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), f"USER must be numeric so runAsNonRoot can verify it: {user}"
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)
    created = " ".join(runtime.all("RUN"))
    assert f"--uid {uid}" in created, "the user must exist in /etc/passwd"
    instructions = [kw for kw, _ in runtime.instructions]
    assert instructions.index("USER") > max(i for i, kw in enumerate(instructions) if kw in ("RUN", "COPY"))


def test_entrypoint_cmd_and_stop_signal(runtime: Stage) -> None:
    assert exec_form(runtime.one("ENTRYPOINT")) == ["sqs-worker"]
    assert exec_form(runtime.one("CMD")) == ["run"]
    assert runtime.one("STOPSIGNAL") == "SIGTERM"


def test_healthcheck_runs_the_health_check_command(runtime: Stage) -> None:
    options, _, command = runtime.one("HEALTHCHECK").partition("CMD ")
    assert exec_form(command) == ["sqs-worker", "health", "--check"]
    timings = dict(option.removeprefix("--").split("=") for option in options.split())
    assert set(timings) >= {"interval", "timeout", "start-period", "retries"}


def test_environment_suits_a_read_only_root_filesystem(runtime: Stage) -> None:
    env = env_values(runtime)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["WORKER_HEALTH_FILE"].startswith("/tmp/"), "the liveness file must live on the /tmp tmpfs"
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_every_copied_file_exists_and_is_in_the_build_context(stages: list[Stage]) -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    names = {stage.name for stage in stages}
    sources: list[str] = []
    for stage in stages:
        for args in stage.all("COPY"):
            words = args.split()
            from_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
            paths = [w for w in words if not w.startswith("--")][:-1]
            if from_stage is not None:
                assert from_stage in names, f"COPY --from={from_stage}: no such stage"
                continue
            sources.extend(paths)
    assert sources
    for source in sources:
        path = REPO_ROOT / source
        assert path.exists(), f"COPY {source}: not in the repository"
        files = [path] if path.is_file() else [p for p in path.rglob("*.py") if "__pycache__" not in p.parts]
        assert files, f"COPY {source}: empty"
        for file in files:
            relative = file.relative_to(REPO_ROOT).as_posix()
            assert dockerignore_keeps(relative, patterns), f"{relative} is excluded by .dockerignore"
    assert not dockerignore_keeps(".venv/bin/python", patterns)
    assert not dockerignore_keeps("worker/__pycache__/cli.cpython-311.pyc", patterns)


def test_hadolint_finds_nothing() -> None:
    if not HADOLINT.exists():
        pytest.fail(f"hadolint is not installed at {HADOLINT}: run infra/hadolint/setup.sh")
    result = subprocess.run(
        [str(HADOLINT), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runtime venv built as the Dockerfile builds it: the lock's runtime set and the worker, not editable."""
    venv = tmp_path_factory.mktemp("image") / "venv"
    uv = shutil.which("uv")
    assert uv is not None, "uv must be on PATH"
    image_sync = [
        *("sync", "--frozen", "--no-default-groups", "--extra", "dashboard", "--extra", "uvloop"),
        *("--no-editable", "--quiet"),
    ]
    subprocess.run(
        [uv, *image_sync, "--python", sys.executable],
        cwd=REPO_ROOT,
        env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)},
        check=True,
        timeout=300,
    )
    return venv


def run_in_image(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run like the container: PATH led by the venv, the image's Python settings, cwd outside the source tree."""
    environment = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "AWS_REGION": "us-east-1",
        **env,
    }
    return subprocess.run(
        list(args), cwd=venv.parent, env=environment, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("sqs-worker", "--help"), "run"),
        (("sqs-worker", "run", "--help"), "usage: sqs-worker run"),
        (("sqs-worker", "health", "--help"), "--check"),
        (("sqs-worker", "dashboard", "--help"), "WORKER_DASHBOARD_TOKEN"),
    ],
)
def test_entrypoint_command_works_from_the_installed_package(
    image_venv: Path, args: tuple[str, ...], expected: str
) -> None:
    result = run_in_image(image_venv, *args)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout


def test_installed_package_is_not_the_source_tree_and_has_no_test_tools(image_venv: Path) -> None:
    probe = (
        "import importlib.util as u, worker; print(worker.__file__); print(u.find_spec('pytest'), u.find_spec('moto'))"
    )
    result = run_in_image(image_venv, "python", "-c", probe)
    assert result.returncode == 0, result.stderr
    location, missing = result.stdout.splitlines()
    assert Path(location).is_relative_to(image_venv), location
    assert missing == "None None"


def test_installed_package_carries_the_dashboard_templates_and_vendored_charts(image_venv: Path) -> None:
    probe = (
        "import worker.dashboard.app as a; "
        "print(all((a.HERE / p).is_file() for p in ('templates/base.html', 'static/uplot/uPlot.iife.min.js', "
        "'static/uplot/LICENSE', 'static/dashboard.js')))"
    )
    result = run_in_image(image_venv, "python", "-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_healthcheck_exit_codes_follow_the_liveness_file(image_venv: Path, tmp_path: Path) -> None:
    health_file = tmp_path / "sqs-worker-health"
    missing = run_in_image(image_venv, "sqs-worker", "health", "--check", WORKER_HEALTH_FILE=str(health_file))
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert missing.stdout.startswith("unhealthy")

    write_liveness_file(str(health_file), time.time())
    fresh = run_in_image(image_venv, "sqs-worker", "health", "--check", WORKER_HEALTH_FILE=str(health_file))
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert fresh.stdout.startswith("healthy")

    write_liveness_file(str(health_file), time.time() - 120)
    stale = run_in_image(
        image_venv, "sqs-worker", "health", "--check", WORKER_HEALTH_FILE=str(health_file), WORKER_HEALTH_MAX_AGE_S="60"
    )
    assert stale.returncode == 1, stale.stdout + stale.stderr


COMPOSE_FILE = REPO_ROOT / "infra" / "docker-compose.yml"
LOCALSTACK_PIN = REPO_ROOT / "infra" / "localstack" / "requirements.in"


def localstack_version() -> str:
    match = re.search(r"^localstack-core\[runtime\]==(\S+)$", LOCALSTACK_PIN.read_text(encoding="utf-8"), re.M)
    assert match, "localstack-core is not pinned exactly"
    return match.group(1)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    return loaded


def test_compose_pins_the_localstack_the_host_launcher_runs(compose: dict[str, Any]) -> None:
    assert compose["services"]["localstack"]["image"] == f"localstack/localstack:{localstack_version()}"


@pytest.mark.parametrize("service", ["bootstrap", "worker"])
def test_compose_worker_services_use_the_image_against_localstack(compose: dict[str, Any], service: str) -> None:
    spec = compose["services"][service]
    assert (COMPOSE_FILE.parent / spec["build"]["context"] / spec["build"]["dockerfile"]).resolve() == DOCKERFILE
    assert spec["read_only"] is True
    assert spec["tmpfs"] == ["/tmp"]
    env = spec["environment"]
    endpoint = urllib.parse.urlsplit(env["AWS_ENDPOINT_URL"])
    assert endpoint.hostname in compose["services"], "AWS_ENDPOINT_URL must name the localstack service"
    assert endpoint.port == 4566
    unknown = {key for key in env if key.startswith("WORKER_")} - {
        f"WORKER_{name.upper()}" for name in WorkerSettings.model_fields
    }
    assert not unknown, f"not worker settings: {unknown}"
    settings = WorkerSettings(
        **{key.removeprefix("WORKER_").lower(): value for key, value in env.items() if key.startswith("WORKER_")}
    )
    for module in settings.handlers:
        importlib.import_module(module)


def test_compose_runs_bootstrap_then_the_worker(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["bootstrap"]["command"] == ["bootstrap"]
    assert services["bootstrap"]["depends_on"] == {"localstack": {"condition": "service_healthy"}}
    assert services["worker"]["command"] == ["run"]
    assert services["worker"]["depends_on"] == {"bootstrap": {"condition": "service_completed_successfully"}}
    grace_s = int(services["worker"]["stop_grace_period"].removesuffix("s"))
    assert grace_s > WorkerSettings.model_fields["shutdown_grace_s"].default, "docker stop must outwait the grace"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(WORKFLOW_FILE.read_text(encoding="utf-8"))
    return loaded


def test_workflow_runs_the_tests_on_both_backends_with_localstack_as_a_service(workflow: dict[str, Any]) -> None:
    tests = workflow["jobs"]["tests"]
    assert tests["services"]["localstack"]["image"] == f"localstack/localstack:{localstack_version()}"
    assert tests["env"]["LOCALSTACK_ENDPOINT_URL"].endswith(":4566")
    assert set(tests["env"]["SQS_WORKER_TEST_BACKENDS"].split(",")) == {"moto", "localstack"}
    assert any("pytest" in step.get("run", "") for step in tests["steps"])
    assert set(workflow["jobs"]) >= {"lint", "tests", "terraform", "checkov"}


def test_workflow_uses_the_lock_and_the_committed_scripts(workflow: dict[str, Any]) -> None:
    commands = "\n".join(step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"])
    assert "uv sync --frozen" in commands
    scripts = set(re.findall(r"bash (infra/\S+\.sh)", commands))
    assert scripts >= {
        "infra/security-checks.sh",
        "infra/localstack/setup.sh",
        "infra/cloudtasks/setup.sh",
        "infra/hadolint/setup.sh",
    }
    for script in scripts:
        assert (REPO_ROOT / script).is_file(), script
