#!/usr/bin/env bash
# Install checkov into its own virtualenv under .tools/checkov (it pins many packages, so it stays out of the
# project's venv). Idempotent: a matching install is kept. Usage: bash infra/terraform/setup-checkov.sh
set -euo pipefail

CHECKOV_VERSION="3.3.30"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.tools/checkov"

if [ -x "$venv/bin/checkov" ] && "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('checkov') != '$CHECKOV_VERSION')" 2>/dev/null; then
    echo "checkov $CHECKOV_VERSION already in $venv"
    exit 0
fi

mkdir -p "$root/.tools"
if command -v uv >/dev/null 2>&1; then
    uv venv --quiet --allow-existing --python 3.11 "$venv"
    uv pip install --quiet --python "$venv/bin/python" "checkov==$CHECKOV_VERSION"
else
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "checkov==$CHECKOV_VERSION"
fi
"$venv/bin/checkov" --version
