#!/usr/bin/env bash
# Create (or bring up to date) LocalStack's own virtualenv: .tools/localstack-venv, or $LOCALSTACK_VENV.
# Installs the hash-pinned requirements.txt and the dynamodb:moto provider plugin; idempotent: does nothing
# when the venv already matches this script, the requirements and the plugin's sources.
# Needs Python 3.11 and PyPI; uses uv when it is on PATH, else python3.11 -m venv and pip.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${LOCALSTACK_VENV:-$root/.tools/localstack-venv}"
python_version="3.11"
stamp_file="$venv/.sqs-worker-setup-stamp"

stamp="$(cd "$here" && find setup.sh requirements.txt dynamodb_moto -type f \
    -not -path '*/__pycache__/*' -not -path '*.egg-info*' -not -path '*/build/*' -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"

if [[ -x "$venv/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
    echo "localstack venv up to date: $venv"
    exit 0
fi

echo "setting up the localstack venv in $venv"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if command -v uv >/dev/null 2>&1; then
    uv venv --quiet --python "$python_version" "$venv"
    # uv reads no pip.conf: the machine's global pip constraints (if any) do not apply here.
    VIRTUAL_ENV="$venv" uv pip install --quiet --require-hashes -r "$here/requirements.txt"
    VIRTUAL_ENV="$venv" uv pip install --quiet --no-deps --no-build-isolation "$here/dynamodb_moto"
else
    "python$python_version" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --require-hashes -r "$here/requirements.txt"
    "$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation "$here/dynamodb_moto"
fi

# Fail here, not in the first test, if the plugin or LocalStack cannot be imported.
"$venv/bin/python" - <<'PY'
from importlib.metadata import entry_points

import localstack.runtime.main  # noqa: F401

names = {ep.name for ep in entry_points(group="localstack.aws.provider")}
assert "dynamodb:moto" in names, f"dynamodb:moto provider plugin not registered: {sorted(names)}"
import localstack_dynamodb_moto.provider  # noqa: F401
PY

echo "$stamp" >"$stamp_file"
echo "localstack venv ready: $venv"
