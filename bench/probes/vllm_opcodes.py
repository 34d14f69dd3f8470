"""Python bytecodes and frames a step in VTC's code in vLLM's scheduler, by function
(``sys.settrace`` with opcode events, on ``vllm_callgrind.py``'s engine; functions
whose file is under a ``vtc/`` directory only, so dataclass-generated ``__init__``s
are not counted). Run in the vLLM virtualenv from the repository root::

    OMP_NUM_THREADS=1 PYTHONPATH=python .venv-vllm/bin/python bench/probes/vllm_opcodes.py
"""

import collections
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
import vllm_callgrind  # noqa: E402

WARMUP, STEPS = 100, 100

engine = vllm_callgrind.build_engine(lambda: None)
for _ in range(WARMUP):
    engine.step()
ops: collections.Counter[str] = collections.Counter()
frames: collections.Counter[str] = collections.Counter()


def tracer(frame, event, arg):  # noqa: ANN001, ANN201
    path = frame.f_code.co_filename
    if "/vtc/" not in path:
        return None
    key = f"{path.split('/vtc/')[-1]}:{frame.f_code.co_qualname}"
    frames[key] += 1
    frame.f_trace_opcodes = True
    frame.f_trace_lines = False

    def count(frame, event, arg):  # noqa: ANN001, ANN202
        if event == "opcode":
            ops[key] += 1
        return count

    return count


sys.settrace(tracer)
for _ in range(STEPS):
    engine.step()
sys.settrace(None)
print(
    f"VTC's code: {sum(ops.values()) / STEPS:.0f} bytecodes and "
    f"{sum(frames.values()) / STEPS:.1f} frames a step ({STEPS} steps after {WARMUP})"
)
for key, n in ops.most_common(30):
    print(f"{n / STEPS:8.1f} bytecodes {frames[key] / STEPS:6.2f} calls  {key}")
