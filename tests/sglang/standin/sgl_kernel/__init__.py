"""A stand-in for ``sgl_kernel``, on ``PYTHONPATH`` only for the real-server tests.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports a few names from
``sgl_kernel``'s CPU build when its modules load (for example
``copy_all_layer_kv_cache_cpu``). That build is made only from source; no
package on PyPI ships it. With ``--attention-backend torch_native`` on a CPU
without AMX, SGLang never calls any of them: the forward runs in PyTorch.

So every name here is a function that raises ``NotImplementedError`` naming
the op. It computes nothing: if SGLang ever calls one, the request fails and
the test with it, loudly, instead of serving something computed wrongly.
Nothing of ``vtc`` uses this package.
"""

from __future__ import annotations

from typing import Any, NoReturn


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def op(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} was called: the vtc test stand-in has no CPU kernels "
            "(tests/sglang/standin); this SGLang path needs the real sgl_kernel build"
        )

    op.__name__ = op.__qualname__ = name
    return op
