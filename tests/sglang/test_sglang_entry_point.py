"""SGLang's own plugin loader finds and runs vtc through the entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ENTRY_POINT = "vtc = vtc.sglang:register"  # [project.entry-points."sglang.srt.plugins"]

PROBE = """
import warnings; warnings.filterwarnings("ignore")
from sglang.srt.plugins import load_plugins
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.schedule_policy import PrefillAdder
load_plugins()
import vtc.sglang
hooked = [hasattr(Scheduler._add_request_to_queue, "__wrapped__"),
          hasattr(PrefillAdder.add_one_req, "__wrapped__")]
print("HOOKED" if all(hooked) else "PLAIN", vtc.sglang.get_state().tenant_key)
"""


def _run_load_plugins(tmp_path: Path, allow: str, **env_vars: str) -> subprocess.CompletedProcess:
    """Run SGLang's load_plugins() in a fresh interpreter that sees a distribution
    declaring the entry point (the same line pyproject.toml declares)."""
    dist = tmp_path / "vtc_entry_point_probe-0.dist-info"
    dist.mkdir(exist_ok=True)
    metadata = "Metadata-Version: 2.1\nName: vtc-entry-point-probe\nVersion: 0\n"
    (dist / "METADATA").write_text(metadata)
    (dist / "entry_points.txt").write_text(f"[sglang.srt.plugins]\n{ENTRY_POINT}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VTC_")}
    env.update(SGLANG_PLUGINS=allow, VTC_TENANT_KEY="org", **env_vars)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )


def _load_plugins(tmp_path: Path, allow: str) -> str:
    out = _run_load_plugins(tmp_path, allow)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(("allow", "expected"), [("vtc", "HOOKED org"), ("other", "PLAIN org")])
def test_load_plugins_honours_the_allow_list(tmp_path: Path, allow: str, expected: str) -> None:
    assert _load_plugins(tmp_path, allow) == expected


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("VTC_WP", "abc", "VTC_WP='abc' is not a number"),
        ("VTC_WEIGHTS", "gold=2;free=1", "VTC_WEIGHTS entry 'gold=2;free=1'"),
        ("VTC_SYNC_INTERVAL", "0", "VTC_SYNC_INTERVAL='0' is out of range"),
        ("VTC_LOCALITY_QUANTUM", "-1", "VTC_LOCALITY_QUANTUM='-1' is out of range"),
    ],
)
def test_a_malformed_variable_stops_sglang_in_load_plugins(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    """load_plugins() swallows an Exception from a plugin (SGLang would serve without
    VTC); register() raises SystemExit instead: the process stops inside
    load_plugins(), before the probe's next line, with the variable named."""
    out = _run_load_plugins(tmp_path, "vtc", **{variable: value})
    assert out.returncode != 0
    assert message in out.stderr
    assert "invalid configuration, SGLang stops" in out.stderr
    assert "HOOKED" not in out.stdout and "PLAIN" not in out.stdout
