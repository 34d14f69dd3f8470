"""A malformed ``VTC_*`` variable stops a real ``vllm serve`` before the model loads.

vLLM calls the ``vllm.general_plugins`` entry points (``vtc.vllm_plugin:validate``,
declared in pyproject.toml) while the API server builds its arguments, before it
starts the engine-core process that loads the model and then builds the
scheduler. The marker is vLLM's own log line ``Starting to load model``
(``vllm/v1/worker/cpu_model_runner.py``, ``load_model``): the same server with a
valid value is watched until it prints it, so its absence from the failed run
means something.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_harness import stop_server

from redis_server import free_port  # tests/, on the path (conftest)

HERE = Path(__file__).resolve().parent
ENTRY_POINT = "vtc.vllm_plugin:validate"  # [project.entry-points."vllm.general_plugins"] vtc
LOADING = "Starting to load model"  # vLLM's log line as the worker starts loading weights
STARTUP_TIMEOUT = 300.0  # seconds: a deadline for a condition, never a wait


def _plugin_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a server that finds vtc's vLLM plugin: vtc's installed
    metadata (``make test-vllm`` installs vtc) or, when vtc is imported from a
    checkout on PYTHONPATH without it, a distribution declaring the same entry point."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VTC_")}
    env.pop("VLLM_PLUGINS", None)  # vLLM's allow-list: unset loads every plugin
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    found = importlib.metadata.entry_points(group="vllm.general_plugins")
    if not any(ep.name == "vtc" and ep.value == ENTRY_POINT for ep in found):
        dist = tmp_path / "site" / "vtc_vllm_plugin_probe-0.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vtc-vllm-plugin-probe\n")
        (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\nvtc = {ENTRY_POINT}\n")
        path = [str(dist.parent), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


def _serve(model: Path, log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(HERE / "vllm_serve.py"),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--skip-tokenizer-init",
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--enforce-eager",
        "--scheduler-cls",
        "vtc.vllm.VTCScheduler",
    ]
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0)


@pytest.mark.timeout(2 * STARTUP_TIMEOUT + 120)
def test_a_malformed_variable_stops_vllm_serve_before_the_model_loads(
    tiny_llama: Path, tmp_path: Path
) -> None:
    env = _plugin_env(tmp_path)
    bad_log = tmp_path / "bad.log"
    proc = _serve(tiny_llama, bad_log, {**env, "VTC_WP": "abc"})
    try:
        returncode = proc.wait(timeout=STARTUP_TIMEOUT)
    finally:
        stop_server(proc)
    bad = bad_log.read_text(errors="replace")
    assert returncode != 0, bad
    assert "ConfigError: VTC_WP='abc' is not a number; expected a number in [0, 1e+09]" in bad
    assert LOADING not in bad

    # The control: with a valid VTC_WP the same server gets as far as loading the model.
    good_log = tmp_path / "good.log"
    proc = _serve(tiny_llama, good_log, {**env, "VTC_WP": "2"})
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while LOADING not in good_log.read_text(errors="replace"):
            assert proc.poll() is None, good_log.read_text(errors="replace")
            assert time.monotonic() < deadline, "vllm serve did not start loading in time"
            time.sleep(0.5)  # polling the log for a condition
    finally:
        stop_server(proc)
    assert "ConfigError" not in good_log.read_text(errors="replace")
