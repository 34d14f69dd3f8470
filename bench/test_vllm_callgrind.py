"""``vllm_callgrind.py``'s counting engine, checked without valgrind (its toggle
recorded here instead). Needs vLLM, so it runs in .venv-vllm with the vLLM
benchmark (``make test-vllm``)."""

from __future__ import annotations

from typing import Any

import pytest

import vllm_callgrind

# (test_vllm_overhead puts tests/vllm, vllm_harness's folder, on the path)
from test_vllm_overhead import MAX_NUM_SEQS, vllm_config, vtc_engine, write_tiny_llama


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), weights=False)
    return vllm_config(
        str(model), max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=8192, max_model_len=1024
    )


def test_callgrind_probe_counts_only_vtc_and_changes_nothing(config: Any) -> None:
    """``vllm_callgrind.py``'s engine (its toggle recorded here, not callgrind's)
    decides as a plain VTC engine does, toggles nothing until measuring, then
    switches collection on and off in pairs, off again inside vLLM's own methods,
    and is off between steps."""
    flips: list[int] = []
    counted = vllm_callgrind.build_engine(lambda: flips.append(1), config)
    plain = vtc_engine(config)
    for _ in range(10):
        counted.step()
        plain.step()
    assert not flips
    counted.counting["measure"] = True
    for _ in range(10):
        counted.step()
        plain.step()
        assert len(flips) % 2 == 0 and not counted.counting["on"]
    # schedule() and update_from_output() each: on, off around vLLM's own, on, off
    assert len(flips) >= 10 * 2 * 4
    assert counted.admissions == plain.admissions
    assert counted.s.vtc.counters() == plain.s.vtc.counters()
