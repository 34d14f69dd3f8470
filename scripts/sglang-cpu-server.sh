#!/usr/bin/env bash
# Try the VTC plugin in a real SGLang server on a CPU (a laptop will do): no GPU,
# packages from PyPI only, a tiny random model made here.
#
#   scripts/sglang-cpu-server.sh [PORT [EXTRA SGLANG ARGS...]]    (PORT default 30000)
#
# 1. .venv-sglang (or SGLANG_VENV) with SGLang 0.5.23 and vtc, by
#    scripts/install-sglang.sh (about 5 GB: PyPI's torch brings CUDA wheels).
# 2. A tiny random Llama under .sglang-cpu/model (or VTC_TINY_MODEL), made by
#    tests/sglang/tiny_model.py.
# 3. SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) with the torch_native attention
#    backend, the plugin on (SGLANG_PLUGINS=vtc; set SGLANG_PLUGINS=none to compare
#    with stock SGLang), prompts as token ids (--skip-tokenizer-init).
#
# SGLang's CPU engine imports a few names from sgl_kernel's CPU build, which only
# a source build provides. tests/sglang/standin is a stand-in package for it whose
# every function raises NotImplementedError naming the op: on this path none is
# called (the forward runs in PyTorch), and if one ever is, the request fails
# loudly instead of computing something wrong. On a GPU, none of this is needed:
#   SGLANG_PLUGINS=vtc python -m sglang.launch_server --model-path MODEL
#
# Then, from another shell:
#   curl -s localhost:30000/generate -H 'Content-Type: application/json' -d \
#     '{"input_ids": [1,2,3,4], "sampling_params": {"max_new_tokens": 16,
#       "custom_params": {"tenant": "acme"}}}'
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SGLANG_VENV:-$REPO/.venv-sglang}
MODEL=${VTC_TINY_MODEL:-$REPO/.sglang-cpu/model}
PORT=${1:-30000}
shift || true

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
fi
"$REPO/scripts/install-sglang.sh" "$VENV"
if [ ! -f "$MODEL/config.json" ]; then
    "$VENV/bin/python" "$REPO/tests/sglang/tiny_model.py" "$MODEL"
fi

echo "sglang-cpu-server: http://127.0.0.1:$PORT (model $MODEL, SGLANG_PLUGINS=${SGLANG_PLUGINS:-vtc})"
exec env SGLANG_USE_CPU_ENGINE=1 \
    SGLANG_PLUGINS="${SGLANG_PLUGINS:-vtc}" \
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
    PYTHONPATH="$REPO/tests/sglang/standin${PYTHONPATH:+:$PYTHONPATH}" \
    "$VENV/bin/python" -m sglang.launch_server \
    --model-path "$MODEL" --device cpu --skip-tokenizer-init \
    --attention-backend torch_native --dtype float32 --max-total-tokens 4096 \
    --host 127.0.0.1 --port "$PORT" "$@"
