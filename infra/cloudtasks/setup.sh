#!/usr/bin/env bash
# Create (or bring up to date) the Cloud Tasks emulator's own virtualenv: .tools/cloudtasks-emulator-venv, or
# $CLOUDTASKS_EMULATOR_VENV. Installs the hash-pinned requirements.txt (gcloud-tasks-emulator and its protobuf<5
# set, kept out of uv.lock); tests/support/cloudtasks.py starts the emulator with this venv's Python.
# Idempotent: does nothing when the venv already matches this script and the requirements.
# Needs Python 3.11 and PyPI; uses uv when it is on PATH, else python3.11 -m venv and pip.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${CLOUDTASKS_EMULATOR_VENV:-$root/.tools/cloudtasks-emulator-venv}"
python_version="3.11"
stamp_file="$venv/.sqs-worker-setup-stamp"
stamp="$(cat "$here/setup.sh" "$here/requirements.txt" | sha256sum | cut -d' ' -f1)"

if [[ -x "$venv/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
    echo "cloud tasks emulator venv up to date: $venv"
    exit 0
fi

echo "setting up the cloud tasks emulator venv in $venv"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if command -v uv >/dev/null 2>&1; then
    uv venv --quiet --python "$python_version" "$venv"
    VIRTUAL_ENV="$venv" uv pip install --quiet --require-hashes -r "$here/requirements.txt"
else
    "python$python_version" -m venv "$venv"
    # --no-deps: requirements.txt is the whole closure, and pip's hash mode rejects the unpinned extra
    # google-cloud-tasks asks for (google-api-core[grpc]; pypa/pip#9644).
    "$venv/bin/python" -m pip install --quiet --no-deps --require-hashes -r "$here/requirements.txt"
fi

# Fail here, not in the first test, if the emulator cannot be imported (its server module imports the client).
"$venv/bin/python" -W ignore::FutureWarning -c "import gcloud_tasks_emulator.server"

echo "$stamp" >"$stamp_file"
echo "cloud tasks emulator venv ready: $venv"
