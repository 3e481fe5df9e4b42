#!/usr/bin/env bash
# Install Celery with the SQS transport (hash-pinned benchmarks/celery-requirements.txt, wheels only: pycurl's
# wheel carries its own libcurl) into .tools/celery-venv, or $CELERY_VENV. Idempotent: does nothing when the
# venv already matches this script and the requirements. Used by benchmarks/compare_celery.py only.
# Regenerate the pins: uv pip compile benchmarks/celery-requirements.in --python-version 3.11 \
#     --only-binary :all: --generate-hashes -o benchmarks/celery-requirements.txt
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="${CELERY_VENV:-$root/.tools/celery-venv}"
stamp_file="$venv/.sqs-worker-setup-stamp"
stamp="$(cat "$here/setup-celery.sh" "$here/celery-requirements.txt" | sha256sum | cut -d' ' -f1)"

if [[ -x "$venv/bin/celery" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
    echo "celery venv up to date: $venv"
    exit 0
fi

echo "setting up the celery venv in $venv"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if command -v uv >/dev/null 2>&1; then
    uv venv --quiet --python 3.11 "$venv"
    VIRTUAL_ENV="$venv" uv pip install --quiet --only-binary :all: --require-hashes -r "$here/celery-requirements.txt"
else
    python3.11 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --only-binary :all: --require-hashes -r "$here/celery-requirements.txt"
fi

# Fail here, not in the benchmark, if the SQS transport cannot load (pycurl, boto3).
"$venv/bin/python" - <<'PY'
import pycurl
import kombu.transport.SQS  # noqa: F401
import celery

print(f"celery {celery.__version__}, {pycurl.version}")
PY
echo "$stamp" >"$stamp_file"
echo "celery venv ready: $venv"
