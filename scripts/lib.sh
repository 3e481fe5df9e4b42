# Shared by scripts/dev and scripts/test: make sure uv (pinned) is available, then the project venv.
# Needs python3 (3.11 or newer) and bash; everything else is installed under .tools/ and .venv/.

UV_VERSION="0.13.8"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

find_python() {
    local candidate
    for candidate in python3.11 python3.12 python3.13 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    echo "sqs-worker needs Python 3.11 or newer on PATH (python3.11 or python3)" >&2
    return 1
}

ensure_uv() {
    local tools="$ROOT/.tools/uv"
    if [[ -x "$tools/bin/uv" ]] && [[ "$("$tools/bin/uv" --version 2>/dev/null)" == "uv $UV_VERSION"* ]]; then
        export PATH="$tools/bin:$PATH"
        return 0
    fi
    local python
    python="$(find_python)"
    echo "installing uv $UV_VERSION into $tools" >&2
    rm -rf "$tools"
    "$python" -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
    export PATH="$tools/bin:$PATH"
}

ensure_venv() {
    ensure_uv
    local python
    python="$(find_python)"
    (cd "$ROOT" && uv sync --frozen --all-extras --python "$python" --quiet)
}

# The dashboard's browser tests drive Debian's chromium (Playwright against the system browser: no browser
# download). Installed with apt-get when missing (root, or sudo without a password).
ensure_chromium() {
    if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
        return 0
    fi
    local sudo=""
    if [[ "$(id -u)" != "0" ]]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "the dashboard's browser tests need chromium: apt-get install -y chromium (as root)" >&2
            return 1
        fi
    fi
    echo "installing chromium (apt-get) for the dashboard's browser tests" >&2
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
}
