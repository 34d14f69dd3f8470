"""vLLM general plugin: validate every ``VTC_*`` variable when vLLM starts.

Declared in ``pyproject.toml`` as the entry point ``vtc`` of the group
``vllm.general_plugins``. vLLM's ``load_general_plugins()`` calls
:func:`validate` in every vLLM process, first in the API server while it
builds its argument parser and ``EngineArgs``, long before the model (and
VTC's scheduler, built after the model in the engine-core process) is loaded,
and does not catch what the call raises: a malformed variable stops
``vllm serve`` at once with the :class:`vtc.config.ConfigError` naming it.

It is loaded whether or not the server uses VTC's scheduler, so it does
nothing unless some ``VTC_*`` variable is set, and it imports neither vLLM nor
torch. ``VLLM_PLUGINS`` (vLLM's allow-list of plugin names) must include
``vtc`` when it is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["validate"]


def validate(environ: Mapping[str, str] | None = None) -> None:
    """Raise :class:`vtc.config.ConfigError` for the first malformed ``VTC_*``
    variable (:func:`vtc.config.check_env`); nothing when none is set."""
    from vtc.config import check_env, configured

    env = os.environ if environ is None else environ
    if configured(env):
        check_env(env)
