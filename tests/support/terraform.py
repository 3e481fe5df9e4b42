"""Running Terraform in tests: the provider mirror, a CLI config pointing at it, and a bounded runner.

The registry is unreachable on these machines; the hashicorp/aws provider sits in a filesystem mirror (see
the field notes). ``cli_config()`` writes a CLI config that installs from it. Where no mirror exists, tests
that need the provider fail loudly in CI (``CI=true``) and skip with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM_DIR = ROOT / "terraform"
MODULE_DIR = TERRAFORM_DIR / "modules" / "sqs-worker"
EXAMPLES_DIR = TERRAFORM_DIR / "examples"
CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
_PROVIDER = Path("registry.terraform.io") / "hashicorp" / "aws"
_KNOWN_MIRRORS = (Path("/opt/tf-plugins"), Path("/usr/share/terraform/plugins"), Path.home() / ".terraform.d/plugins")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip with ``reason`` when ``condition`` fails, except in CI, where the missing tool fails the test."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"{reason} (CI=true: required)")
    pytest.skip(reason)


def terraform_binary() -> str | None:
    return shutil.which("terraform")


def find_mirror() -> Path | None:
    """The provider mirror's root (the folder holding ``registry.terraform.io``), or None."""
    override = os.environ.get("TF_PLUGIN_MIRROR")
    candidates = [Path(override)] if override else list(_KNOWN_MIRRORS)
    for candidate in candidates:
        if (candidate / _PROVIDER).is_dir():
            return candidate
    if override:
        return None
    found = subprocess.run(  # a bounded search, as the field notes describe
        [
            "find",
            "/",
            "-maxdepth",
            "7",
            "(",
            "-name",
            ".terraform",
            "-o",
            "-path",
            "/proc",
            ")",
            "-prune",
            "-o",
            "-path",
            f"*/{_PROVIDER}",
            "-type",
            "d",
            "-print",
            "-quit",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout.strip()
    return Path(found).parents[2] if found else None


def cli_config(directory: Path, mirror: Path) -> Path:
    """Write a CLI config installing every registry.terraform.io provider from ``mirror``."""
    path = directory / "cli.tfrc"
    path.write_text(
        "provider_installation {\n"
        "  filesystem_mirror {\n"
        f'    path    = "{mirror}"\n'
        '    include = ["registry.terraform.io/*/*"]\n'
        "  }\n"
        "  direct {\n"
        '    exclude = ["registry.terraform.io/*/*"]\n'
        "  }\n"
        "}\n",
        encoding="utf-8",
    )
    return path


@dataclass
class Terraform:
    """Runs ``terraform`` with a given CLI config, each call bounded in time.

    Each working directory gets its own data directory under ``data_root`` (not ``.terraform/`` in the tree).
    """

    binary: str
    cli_config_file: Path | None
    data_root: Path

    def env(self, directory: Path) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("TF_", "AWS_ENDPOINT"))}
        data_dir = self.data_root / "-".join(directory.resolve().parts[-3:])
        env.update(TF_IN_AUTOMATION="1", TF_INPUT="0", CHECKPOINT_DISABLE="1", TF_DATA_DIR=str(data_dir))
        if self.cli_config_file is not None:
            env["TF_CLI_CONFIG_FILE"] = str(self.cli_config_file)
        return env

    def run(self, directory: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, f"-chdir={directory}", *args],
            env=self.env(directory),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def check(self, directory: Path, *args: str, timeout_s: float = 120) -> str:
        """Run and return stdout; a failure raises with both streams (what Terraform said matters)."""
        result = self.run(directory, *args, timeout_s=timeout_s)
        if result.returncode != 0:
            raise AssertionError(
                f"terraform {' '.join(args)} in {directory} exited {result.returncode}\n"
                f"--- stdout\n{result.stdout[-6000:]}\n--- stderr\n{result.stderr[-6000:]}"
            )
        return result.stdout


@dataclass
class Applied:
    """What ``terraform apply`` of ``examples/local`` made, as the module's outputs say."""

    endpoint_url: str
    name: str
    variables: dict[str, str]  # the -var values given to apply
    outputs: dict[str, Any]

    def client(self, service: str) -> Any:
        return boto3.client(service, endpoint_url=self.endpoint_url, region_name="us-east-1")  # type: ignore[call-overload]


@contextlib.contextmanager
def applied_local_example(
    endpoint_url: str, work: Path, *, name: str, variables: dict[str, str] | None = None, destroy: bool = True
) -> Iterator[Applied]:
    """``terraform apply`` of ``terraform/examples/local`` against ``endpoint_url`` (a copy of the tree under
    ``work``); ``destroy`` afterwards unless told not to. Needs terraform and the provider mirror (else skips,
    or fails in CI)."""
    binary = terraform_binary()
    require(binary is not None, "terraform is not on PATH")
    mirror = find_mirror()
    require(mirror is not None, "no hashicorp/aws provider mirror on this machine (see docs/terraform.md)")
    assert binary is not None and mirror is not None
    tree = work / "terraform"
    skipped = shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl")
    shutil.copytree(TERRAFORM_DIR, tree, ignore=skipped)
    root = tree / EXAMPLES_DIR.relative_to(TERRAFORM_DIR) / "local"
    terraform = Terraform(binary, cli_config(work, mirror), work / "data")
    given = {"endpoint_url": endpoint_url, "name": name, **(variables or {})}
    arguments = [f"-var={key}={value}" for key, value in given.items()]
    terraform.check(root, "init", "-backend=false", "-input=false", "-no-color")
    try:
        terraform.check(root, "apply", "-auto-approve", "-input=false", "-no-color", *arguments, timeout_s=400)
        outputs = json.loads(terraform.check(root, "output", "-json", "-no-color"))["worker"]["value"]
        yield Applied(endpoint_url, name, given, outputs)
    finally:
        if destroy:
            terraform.check(root, "destroy", "-auto-approve", "-input=false", "-no-color", *arguments, timeout_s=400)
