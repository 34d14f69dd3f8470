# Sourced by scripts/install-vllm.sh and scripts/install-sglang.sh: the part of
# their recipes that is the same. Expects PY (the virtualenv's python) and WHAT
# (what is being installed, for the refusal message); reads TORCH_VERSION
# (default 2.13.0). Refuses a python outside a virtualenv, defines
# `installed NAME VERSION` and `pip_install ARGS...`, makes "$tmp" (removed on exit) holding
# constraints.txt with torch pinned, records the start time in "$start", and
# installs torch from PyPI with its own dependencies (on Linux x86_64 that is
# the CUDA runtime wheels it loads at import) unless that version is there.

TORCH_VERSION=${TORCH_VERSION:-2.13.0}

if [ ! -x "$PY" ] || ! "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    echo "$PY is not the python of a virtualenv; refusing to install $WHAT outside one" >&2
    exit 2
fi

installed() {  # installed NAME VERSION: exit 0 iff that exact version is installed
    "$PY" - "$1" "$2" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    sys.exit(version(sys.argv[1]) != sys.argv[2])
except PackageNotFoundError:
    sys.exit(1)
PYEOF
}

# pip_install ARGS...: `pip install ARGS` into this virtualenv, tried up to
# PIP_INSTALL_ATTEMPTS times (default 3). pip retries a failed connection and
# resumes a cut download by itself (PIP_RETRIES, PIP_RESUME_RETRIES, exported by
# the Makefile), but a run of interrupted resumes still ends the install: one CI
# run lost its SGLang suite to a 200 MB nvidia wheel cut at the same byte six
# times. A fresh attempt after a pause starts a new connection; what pip has
# already installed or cached is not fetched again.
pip_install() {
    local attempt=1 attempts=${PIP_INSTALL_ATTEMPTS:-3}
    until "$PY" -m pip install "$@"; do
        if [ "$attempt" -ge "$attempts" ]; then
            echo "pip install $* failed $attempts times; giving up" >&2
            return 1
        fi
        echo "pip install failed (attempt $attempt of $attempts); trying again in $((attempt * 15)) s" >&2
        sleep $((attempt * 15))
        attempt=$((attempt + 1))
    done
}

start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "torch==$TORCH_VERSION" > "$tmp/constraints.txt"

# 1. torch, with its own dependencies.
if ! installed torch "$TORCH_VERSION"; then
    pip_install -q "torch==$TORCH_VERSION"
fi
