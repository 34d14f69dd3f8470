# Sourced by scripts/install-vllm.sh and scripts/install-sglang.sh: the part of
# their recipes that is the same. Expects PY (the virtualenv's python) and WHAT
# (what is being installed, for the refusal message); reads TORCH_VERSION
# (default 2.13.0). Refuses a python outside a virtualenv, defines
# `installed NAME VERSION`, makes "$tmp" (removed on exit) holding
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

start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "torch==$TORCH_VERSION" > "$tmp/constraints.txt"

# 1. torch, with its own dependencies.
if ! installed torch "$TORCH_VERSION"; then
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
fi
