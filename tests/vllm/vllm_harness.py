"""Build vLLM's real V1 scheduler on CPU and drive it like the engine does.

The recipe follows vLLM's own CPU scheduler tests (a ``ModelConfig`` on a local
folder holding a ``config.json``, a ``KVCacheConfig`` with one full-attention
group and ``num_blocks`` blocks), written anew here: vLLM's test package is not
installed with it. The model runner is replaced by :func:`step`, which says
which tokens each scheduled request produced.

Also :func:`stop_server`, the teardown of a real ``vllm serve`` that the server
tests (``test_vllm_e2e.py``, ``test_vllm_startup.py``) start.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK_SIZE = 16
VOCAB = 512
TOKEN = 7  # what the fake model "generates"

init_none_hash(sha256)
_BLOCK_HASHER = get_request_block_hasher(BLOCK_SIZE, sha256)
_ids = itertools.count()


def write_tiny_llama(path: Path, weights: bool) -> Path:
    """A 2-layer Llama (vocab 512, hidden 256, 4 heads of 64), randomly initialised.

    ``weights=False`` writes only ``config.json`` (enough for the scheduler).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
    )
    path.mkdir(parents=True, exist_ok=True)
    if weights:
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(path)
    else:
        config.save_pretrained(path)
    return path


@functools.cache
def vllm_config(
    model_dir: str,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 2048,
    max_model_len: int = 2048,
    enable_prefix_caching: bool = False,
    async_scheduling: bool = False,
    max_loras: int = 0,
    policy: str = "fcfs",
) -> VllmConfig:
    """A ``VllmConfig`` for a scheduler on CPU (cached: building one takes seconds)."""
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        async_scheduling=async_scheduling,
        is_encoder_decoder=False,
        policy=policy,
    )
    model_config = ModelConfig(
        model=model_dir,
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=max_model_len,
    )
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=enable_prefix_caching)
    lora_config = LoRAConfig(max_loras=max_loras) if max_loras else None
    config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        lora_config=lora_config,
    )
    # vLLM's CPU platform turns async scheduling off (platforms/cpu.py,
    # check_and_update_config); a GPU keeps what was asked, as here.
    config.scheduler_config.async_scheduling = async_scheduling
    return config


def make_scheduler(cls: type, config: VllmConfig, num_blocks: int = 1000) -> Any:
    """An instance of ``cls`` (vLLM's Scheduler or a subclass) with ``num_blocks`` KV blocks."""
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    config.cache_config.num_gpu_blocks = num_blocks
    return cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
        log_stats=True,
    )


def make_request(
    tenant: Any = None,
    prompt_len: int = 32,
    max_tokens: int = 8,
    *,
    prompt: Sequence[int] | None = None,
    extra_args: dict | None = None,
    lora: str | None = None,
    request_id: str | None = None,
    priority: int = 0,
) -> Request:
    """A generation request; ``tenant`` goes in ``extra_args["tenant"]`` unless None.

    Prompts are distinct per request (no accidental prefix-cache hits) unless
    ``prompt`` is given.
    """
    n = next(_ids)
    if prompt is None:
        prompt = [3 + (n * 131 + j * 17 + (j * j) % 13) % (VOCAB - 3) for j in range(prompt_len)]
    if extra_args is None and tenant is not None:
        extra_args = {"tenant": tenant}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra_args)
    lora_request = LoRARequest(lora, abs(hash(lora)) % 1000 + 1, "/nonexistent") if lora else None
    return Request(
        request_id=request_id or f"req-{n}",
        prompt_token_ids=list(prompt),
        sampling_params=params,
        pooling_params=None,
        lora_request=lora_request,
        block_hasher=_BLOCK_HASHER,
        priority=priority,
    )


def model_output(
    scheduler: Scheduler, output: SchedulerOutput, tokens_per_step: int = 1
) -> ModelRunnerOutput:
    """What a model runner returns: ``tokens_per_step`` tokens for every request whose
    prompt is done, nothing for a prefill chunk. Several model speculative decoding:
    ``output`` is then marked as vLLM marks such a step, each such request given
    ``tokens_per_step - 1`` draft tokens (all accepted), and the scheduler, which
    has no drafter, keeps no statistics of them."""
    req_ids = list(output.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        # vLLM marks a request whose prompt is not all computed yet as a prefill chunk.
        done = not scheduler.requests[req_id].is_prefill_chunk
        sampled.append([TOKEN] * tokens_per_step if done else [])
        if done and tokens_per_step > 1:
            output.scheduled_spec_decode_tokens[req_id] = [TOKEN] * (tokens_per_step - 1)
            scheduler.make_spec_decoding_stats = lambda stats, *args, **kwargs: stats
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def step(scheduler: Scheduler, tokens_per_step: int = 1) -> tuple[SchedulerOutput, dict]:
    """One synchronous engine step: schedule, "run" the model, update."""
    output = scheduler.schedule()
    result = scheduler.update_from_output(output, model_output(scheduler, output, tokens_per_step))
    return output, result


def admitted(output: SchedulerOutput) -> list[str]:
    """Ids of the requests admitted for the first time in a step."""
    return [r.req_id for r in output.scheduled_new_reqs]


def run_until_idle(
    scheduler: Scheduler, max_steps: int = 10_000, tokens_per_step: int = 1
) -> list[str]:
    """Step until no request is left; returns the first-admission order."""
    order: list[str] = []
    for _ in range(max_steps):
        if not scheduler.has_requests():
            return order
        output, _ = step(scheduler, tokens_per_step)
        order += admitted(output)
    raise AssertionError(f"scheduler still busy after {max_steps} steps")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM a ``vllm serve`` started in its own process group (the API server
    shuts its engine down), then SIGKILL whatever is left of that group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60.0)  # a deadline: a killed engine can take seconds to be gone here
