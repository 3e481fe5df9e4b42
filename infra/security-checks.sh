#!/usr/bin/env bash
# Security checks, run by the test command (.ci/run) and by CI:
#   1. bandit over worker/ (config: [tool.bandit] in pyproject.toml); any finding fails.
#   2. pip-audit over the locked set users install (runtime dependencies plus every extra: dev, recipes, otel, gcp,
#      dashboard; no test tools) from uv.lock with hashes; any known vulnerability fails.
# pip-audit needs PyPI's vulnerability data (the JSON API of pypi.org). Where that cannot be reached (a registry
# mirror serving only packages), every package comes back "could not be audited": the script says so loudly and
# passes, unless SECURITY_AUDIT_REQUIRED=1 (the GitHub workflow sets it), where it fails.
# Usage: infra/security-checks.sh   (from anywhere; uses .venv/bin/{bandit,pip-audit} or those on PATH)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tool() { if [[ -x ".venv/bin/$1" ]]; then echo ".venv/bin/$1"; else command -v "$1"; fi; }
bandit="$(tool bandit)"
pip_audit="$(tool pip-audit)"
python="$(tool python)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== bandit"
"$bandit" -q -r worker -c pyproject.toml
echo "bandit: no findings"

echo "== pip-audit (uv.lock: runtime dependencies + every extra)"
uv export --frozen --no-default-groups --all-extras --no-emit-project --format requirements-txt \
    --quiet -o "$work/requirements.txt"
set +e
"$pip_audit" -r "$work/requirements.txt" --disable-pip --require-hashes --progress-spinner off \
    -f json -o "$work/audit.json" 2>"$work/audit.err"
audit_rc=$?
set -e

"$python" - "$work/audit.json" "$audit_rc" "$work/audit.err" <<'PY'
import json
import os
import sys
from pathlib import Path

report_path, audit_rc, errors_path = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
required = os.environ.get("SECURITY_AUDIT_REQUIRED") == "1"


def unreachable(why: str) -> None:
    print("!" * 78)
    print(f"pip-audit COULD NOT AUDIT: {why}")
    print("PyPI's vulnerability data is not reachable from this machine; no vulnerability check was done.")
    print("!" * 78)
    sys.exit(1 if required else 0)


if not report_path.exists() or report_path.stat().st_size == 0:
    tail = errors_path.read_text(errors="replace").strip().splitlines()[-5:]
    unreachable(f"pip-audit exited {audit_rc} without a report: " + " | ".join(tail))
dependencies = json.loads(report_path.read_text())["dependencies"]
vulnerable = [d for d in dependencies if d.get("vulns")]
skipped = [d for d in dependencies if "skip_reason" in d]
for dep in vulnerable:
    for vuln in dep["vulns"]:
        fixes = ", ".join(vuln.get("fix_versions", [])) or "no fix yet"
        print(f"VULNERABLE {dep['name']} {dep['version']}: {vuln['id']} (fixed in: {fixes})")
if vulnerable:
    print(f"pip-audit: {len(vulnerable)} vulnerable package(s) in uv.lock")
    sys.exit(1)
if skipped and len(skipped) == len(dependencies):
    unreachable(f"all {len(dependencies)} packages skipped ({skipped[0]['skip_reason']})")
if skipped:
    print(f"pip-audit: could not audit {len(skipped)} package(s): {', '.join(d['name'] for d in skipped)}")
    sys.exit(1 if required else 0)
print(f"pip-audit: {len(dependencies)} packages, no known vulnerabilities")
PY
