"""Static checks of the Terraform: fmt, init from the provider mirror, validate, the module's own tests with a
mocked provider (``terraform test``), and checkov with zero failed checks.

The provider comes from the machine's filesystem mirror (tests/support/terraform.py). Without Terraform, the
mirror or checkov these tests skip with the reason; in CI (CI=true) they fail instead.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.terraform import (
    CHECKOV,
    EXAMPLES_DIR,
    MODULE_DIR,
    TERRAFORM_DIR,
    Terraform,
    cli_config,
    find_mirror,
    require,
    terraform_binary,
)

TERRAFORM_ROOTS = [MODULE_DIR, *sorted(path for path in EXAMPLES_DIR.iterdir() if path.is_dir())]


@pytest.fixture(scope="module")
def terraform(tmp_path_factory: pytest.TempPathFactory) -> Terraform:
    binary = terraform_binary()
    require(binary is not None, "terraform is not on PATH")
    assert binary is not None
    mirror = find_mirror()
    require(mirror is not None, "no hashicorp/aws provider mirror on this machine (see docs/terraform.md)")
    assert mirror is not None
    directory = tmp_path_factory.mktemp("terraform")
    return Terraform(binary, cli_config(directory, mirror), directory / "data")


def test_fmt_is_clean() -> None:
    binary = terraform_binary()
    require(binary is not None, "terraform is not on PATH")
    assert binary is not None
    result = subprocess.run(
        [binary, "fmt", "-check", "-recursive", "-diff", str(TERRAFORM_DIR)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"terraform fmt would change:\n{result.stdout}{result.stderr}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("root", TERRAFORM_ROOTS, ids=lambda path: str(path.relative_to(TERRAFORM_DIR)))
def test_init_from_the_mirror_and_validate(terraform: Terraform, root: Path) -> None:
    terraform.check(root, "init", "-backend=false", "-input=false", "-no-color")
    output = terraform.check(root, "validate", "-json", "-no-color")
    report = json.loads(output)
    assert report["valid"] is True, report
    assert report["warning_count"] == 0, report["diagnostics"]


@pytest.mark.timeout(600)
def test_module_tests_pass_with_a_mocked_provider(terraform: Terraform) -> None:
    terraform.check(MODULE_DIR, "init", "-backend=false", "-input=false", "-no-color")
    output = terraform.check(MODULE_DIR, "test", "-no-color", timeout_s=540)
    summary = re.search(r"Success! (\d+) passed, 0 failed", output)
    assert summary is not None, output[-4000:]
    runs = len(re.findall(r'^\s*run "[^"]+"\.\.\. pass', output, flags=re.MULTILINE))
    assert runs == int(summary.group(1)) >= 18, output[-4000:]


@pytest.mark.timeout(300)
def test_checkov_finds_nothing() -> None:
    require(CHECKOV.exists(), f"checkov is not installed: run bash infra/terraform/setup-checkov.sh ({CHECKOV})")
    result = subprocess.run(
        [str(CHECKOV), "--directory", str(TERRAFORM_DIR), "--framework", "terraform", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [
        f"{check['check_id']} {check['resource']} ({check['file_path']}:{check['file_line_range']})"
        for report in reports
        for check in report["results"]["failed_checks"]
    ]
    passed = sum(report["summary"]["passed"] for report in reports)
    assert not failed, "checkov failed checks:\n" + "\n".join(failed)
    assert passed > 40, f"checkov ran only {passed} checks: did it scan the module?"
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_checkov_skip_is_justified_inline() -> None:
    skips = []
    for path in TERRAFORM_DIR.rglob("*.tf"):
        if ".terraform" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "checkov:skip" in line:
                skips.append((path, number, line))
    for path, number, line in skips:
        assert re.search(r"#\s*checkov:skip=CKV2?_[A-Z]+_\d+:\s*\S.{9,}", line), (
            f"{path}:{number}: skip without a reason"
        )
