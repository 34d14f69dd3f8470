"""A tiny random Llama for real-engine tests on a CPU (no download).

    python tests/sglang/tiny_model.py DIR    # writes config.json + model.safetensors

Used by tests/sglang/test_sglang_server.py and scripts/sglang-cpu-server.sh.
Random weights (seeded): the output is noise, but a real forward computes it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def make_tiny_llama(path: Path | str) -> Path:
    """Save a 2-layer, 256-wide float32 Llama with a 512-token vocabulary at ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tiny_model.py DIR")
    print(make_tiny_llama(sys.argv[1]))
