"""The package as users get it (`make test-package`, part of `make test`).

The sdist is built from this checkout, the wheel is built from the sdist with
only a Rust toolchain and maturin (as `pip install vtc-*.tar.gz` does), and the
wheel is installed into a fresh virtualenv on another CPython minor version,
with no Rust toolchain on PATH. There it runs a scheduler step and the
simulator, first from the base install (no matplotlib: --plot must name the
extra), then with the ``sim`` extra (a real PNG).

Pick the other interpreter with VTC_PACKAGE_PYTHON; otherwise the first
working python3.12 / 3.13 / 3.10 / 3.14 on PATH or under pyenv, else this one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A build compiles the whole crate graph with fat LTO: minutes on two busy cores.
pytestmark = pytest.mark.timeout(3600)


def _version() -> str:
    section = (ROOT / "Cargo.toml").read_text().split("[workspace.package]", 1)[1]
    return re.search(r'^version = "([^"]+)"', section, re.M).group(1)


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``; on failure, fail the test with what it printed."""
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        pytest.fail(f"{cmd} exited {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}")
    return r


def _minor(exe: str) -> tuple[int, int] | None:
    """(major, minor) of a Python that runs and has venv, else None."""
    try:
        r = subprocess.run(
            [exe, "-c", "import sys, venv; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    major, minor = map(int, r.stdout.split())
    return major, minor


def _other_python() -> tuple[str, tuple[int, int]]:
    if os.environ.get("VTC_PACKAGE_PYTHON"):
        exe = os.environ["VTC_PACKAGE_PYTHON"]
        got = _minor(exe)
        assert got is not None, f"VTC_PACKAGE_PYTHON={exe!r} does not run python with venv"
        return exe, got
    here = sys.version_info[:2]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for minor in (12, 13, 10, 14):
        candidates = [shutil.which(f"python3.{minor}")]
        candidates += sorted(map(str, pyenv_root.glob(f"versions/3.{minor}.*/bin/python3.{minor}")))
        for exe in filter(None, candidates):
            got = _minor(exe)
            if got is not None and got >= (3, 10) and got != here:
                return exe, got
    # The issue allows the same minor version when it is the only one present.
    print(f"test_package: no other CPython >= 3.10 found; using {sys.executable}")
    return sys.executable, here


def _env_without_rust(venv_bin: Path) -> dict[str, str]:
    """This environment with PATH reduced to the venv and the directories without Rust tools."""
    keep = [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not any((Path(d) / tool).exists() for tool in ("cargo", "rustc", "rustup"))
    ]
    env = dict(os.environ, PATH=os.pathsep.join([str(venv_bin), *keep]))
    for var in ("CARGO_HOME", "RUSTUP_HOME", "PYTHONPATH", "VIRTUAL_ENV", "PYENV_VERSION"):
        env.pop(var, None)
    return env


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    _run([sys.executable, "-m", "maturin", "sdist", "--out", str(out)], cwd=ROOT)
    (path,) = out.glob("*.tar.gz")
    return path


@pytest.fixture(scope="module")
def wheel(sdist, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # What `pip install vtc-*.tar.gz` does: an isolated build with maturin from PyPI and the
    # Rust toolchain on PATH, nothing from this checkout.
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(sdist)],
        cwd=out,
        env=dict(os.environ, CARGO_TARGET_DIR=str(out / "target")),
    )
    (path,) = out.glob("*.whl")
    return path


def test_sdist_holds_what_a_build_needs(sdist):
    assert sdist.name == f"vtc-{_version()}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in (
        "pyproject.toml",
        "Cargo.toml",
        "Cargo.lock",
        "rust/core/src/lib.rs",
        "rust/core/src/scheduler/mod.rs",
        "rust/python/src/lib.rs",
        "python/vtc/__init__.py",
        "python/vtc/_core.pyi",
        "python/vtc/sim/__main__.py",
    ):
        assert needed in names, f"{needed} missing from {sdist.name}"


def test_wheel_is_one_abi3_wheel_with_the_package(wheel):
    # cp310-abi3: one wheel for every CPython from 3.10 on.
    assert re.fullmatch(rf"vtc-{re.escape(_version())}-cp310-abi3-[a-z0-9_.]+\.whl", wheel.name), (
        wheel.name
    )
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = z.read(f"vtc-{_version()}.dist-info/METADATA").decode()
    assert "vtc/_core.abi3.so" in names
    assert {"vtc/__init__.py", "vtc/_core.pyi", "vtc/py.typed", "vtc/sim/__main__.py"} <= names
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert [r.split(":", 1)[1].split(">")[0].strip() for r in base] == ["numpy"], requires
    extras = {
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Provides-Extra:")
    }
    assert {"sim", "redis", "metrics", "test"} <= extras
    assert any("matplotlib" in r and "extra == 'sim'" in r.replace('"', "'") for r in requires)


STEP = """
import sys, vtc
assert vtc._core.__file__.endswith("_core.abi3.so"), vtc._core.__file__
assert vtc.__version__ == sys.argv[1], (vtc.__version__, sys.argv[1])
s = vtc.Scheduler(M=100)
s.submit(1, "a", 30)
s.submit(2, "b", 30)
s.submit(3, "a", 30)
assert s.schedule() == [1, 2, 3]
assert s.decode() == []
s.finish(1)
assert (s.num_running, s.occupancy) == (2, 62)
assert s.counter("a") == 30 * 2 + 2 * 2.0 and s.counter("b") == 30 + 2.0
print("step ok", sys.version_info[:2])
"""


def test_wheel_installs_and_runs_on_another_python_without_rust(wheel, tmp_path):
    exe, minor = _other_python()
    venv_dir = tmp_path / "venv"
    _run([exe, "-m", "venv", str(venv_dir)])
    py = venv_dir / "bin" / "python"
    env = _env_without_rust(venv_dir / "bin")
    assert shutil.which("cargo", path=env["PATH"]) is None
    assert shutil.which("rustc", path=env["PATH"]) is None
    # Run away from the checkout, so that nothing imports python/vtc from it.
    work = tmp_path / "work"
    work.mkdir()

    def run(*args, check=True):
        cmd = [str(py), *args]
        if check:
            return _run(cmd, cwd=work, env=env)
        return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)

    run("-m", "pip", "install", "-q", "--only-binary", ":all:", str(wheel))
    out = run("-c", STEP, _version()).stdout
    assert f"step ok ({minor[0]}, {minor[1]})" in out

    # The base install has no matplotlib: the simulator runs, --plot names the extra.
    assert (
        "absent"
        in run(
            "-c",
            "import importlib.util as u; print('absent' if u.find_spec('matplotlib') is None "
            "else 'present')",
        ).stdout
    )
    sim = run("-m", "vtc.sim", "returning", "--no-progress").stdout
    assert "returning_share" in sim and "vtc" in sim
    png = work / "returning.png"
    refused = run("-m", "vtc.sim", "returning", "--plot", str(png), "--no-progress", check=False)
    assert refused.returncode == 2, refused
    assert "pip install 'vtc[sim]'" in refused.stderr
    assert not png.exists()

    # With the sim extra the same command writes a PNG.
    run("-m", "pip", "install", "-q", "--only-binary", ":all:", f"{wheel}[sim]")
    run("-m", "vtc.sim", "returning", "--plot", str(png), "--no-progress")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
