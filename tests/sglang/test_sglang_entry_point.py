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


def _load_plugins(tmp_path: Path, allow: str) -> str:
    """Run SGLang's load_plugins() in a fresh interpreter that sees a distribution
    declaring the entry point (the same line pyproject.toml declares)."""
    dist = tmp_path / "vtc_entry_point_probe-0.dist-info"
    dist.mkdir(exist_ok=True)
    metadata = "Metadata-Version: 2.1\nName: vtc-entry-point-probe\nVersion: 0\n"
    (dist / "METADATA").write_text(metadata)
    (dist / "entry_points.txt").write_text(f"[sglang.srt.plugins]\n{ENTRY_POINT}\n")
    env = dict(os.environ, SGLANG_PLUGINS=allow, VTC_TENANT_KEY="org")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(("allow", "expected"), [("vtc", "HOOKED org"), ("other", "PLAIN org")])
def test_load_plugins_honours_the_allow_list(tmp_path: Path, allow: str, expected: str) -> None:
    assert _load_plugins(tmp_path, allow) == expected
