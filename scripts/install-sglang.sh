#!/usr/bin/env bash
# Install SGLang (pinned, CPU-only machine) and vtc into an existing virtualenv, from PyPI only.
#
#   scripts/install-sglang.sh VENV_DIR
#
# VENV_DIR is the virtualenv to install into (make test-sglang uses .venv-sglang).
# The recipe (issue 8):
#
#   1. torch==2.13.0 from PyPI (its Linux x86_64 wheel links the CUDA runtime and
#      pulls the nvidia-*/cuda-* wheels; they are downloaded, never used here).
#      sglang 0.5.23 declares torch==2.14.1; 2.13.0 is the one this project
#      already uses for vLLM, and SGLang's scheduler imports and runs beside it.
#   2. sglang==0.5.23 with --no-deps: its full requirement set is the CUDA
#      serving stack (flashinfer, sglang-kernel, deep-gemm, ...), which does not
#      install or run without a GPU.
#   3. Only the distributions that `sglang.srt.managers.scheduler` needs to
#      import, and those a real server (`python -m sglang.launch_server`, the
#      tests in tests/sglang/test_sglang_server.py) needs on top: uvloop,
#      jsonschema, soundfile, xgrammar, python-multipart (found by starting the
#      server with each candidate of issue 18's list made unimportable; the
#      others were not needed). Each at SGLang's own pin when it declares one,
#      torch held at 2.13.0 by a constraint.
#   4. vtc itself, editable (`pip install -e .[metrics,redis]`, built by maturin, with
#      prometheus_client for its per-tenant metrics), pytest and pytest-timeout
#      (pyproject sets a `timeout`).
#
# Idempotent: a second run finds everything installed and only checks.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 VENV_DIR" >&2
    exit 2
fi
PY=$1/bin/python
REPO=$(cd "$(dirname "$0")/.." && pwd)
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
# What `import sglang.srt.managers.scheduler` needs on a CPU-only machine, then what a
# real server needs on top (last line).
IMPORT_DEPS="orjson IPython traitlets gguf torchvision pybase64 packaging starlette msgspec
pydantic pyzmq aiohttp huggingface_hub setproctitle apache-tvm-ffi transformers tokenizers
python-dateutil dill sentencepiece compressed-tensors openai partial_json_parser einops
uvicorn fastapi
uvloop jsonschema soundfile xgrammar python-multipart"

WHAT=SGLang
# shellcheck source=lib-torch-venv.sh
source "$REPO/scripts/lib-torch-venv.sh"  # refuses a non-venv; step 1: torch

# 2. SGLang itself, without its GPU requirement set.
if ! installed sglang "$SGLANG_VERSION"; then
    pip_install -q --no-deps "sglang==$SGLANG_VERSION"
fi

# 3. The import-time requirements, at SGLang's pins where it has them.
"$PY" - "$tmp/requirements.txt" $IMPORT_DEPS <<'PYEOF'
import re
import sys
from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


pins = {}
for spec in requires("sglang") or []:
    req = Requirement(spec)
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        req.marker = None
        pins[norm(req.name)] = str(req)
wanted = sys.argv[2:]
lines = [pins.get(norm(name), name) for name in wanted]
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
print("sglang import requirements: " + " ".join(lines))
PYEOF
pip_install -q --no-warn-conflicts -r "$tmp/requirements.txt" -c "$tmp/constraints.txt"

# 4. vtc (editable) and the test runner, torch still held.
pip_install -q --no-warn-conflicts -e "$REPO[metrics,redis]" pytest pytest-timeout -c "$tmp/constraints.txt"

# The point: SGLang's scheduler and the plugin import on this CPU, beside this torch.
"$PY" -W ignore - <<'PYEOF'
from importlib.metadata import entry_points, version

import torch
import sglang.srt.managers.scheduler  # noqa: F401
import vtc.sglang

eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "vtc"]
where = eps[0].value if eps else "NOT registered (pyproject entry point missing)"
print(
    f"sglang {version('sglang')}, torch {torch.__version__} (cuda: {torch.cuda.is_available()}),"
    f" vtc {version('vtc')}; sglang.srt.plugins entry point vtc -> {where}"
)
PYEOF
echo "install-sglang: done in $(( $(date +%s) - start )) s"
