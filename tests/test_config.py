"""vtc.config: every VTC_* variable the engine shells read, good and bad, and the
tenant rule both engines share. No engine is imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vtc import config as C
from vtc.config import ConfigError, EngineConfig


def test_defaults_from_an_empty_environment():
    cfg = EngineConfig.from_env({})
    assert cfg == EngineConfig()
    assert (cfg.tenant_key, cfg.default_tenant, dict(cfg.weights)) == ("tenant", "default", {})
    assert (cfg.wp, cfg.wq, cfg.max_tenants) == (1.0, 2.0, 10_000)
    assert (cfg.log_interval, cfg.trace_file, cfg.trace_interval) == (10.0, None, 0.1)


def test_blank_values_are_defaults():
    env = {name: "  " for name in C.VARIABLES}
    assert EngineConfig.from_env(env) == EngineConfig()


def test_every_variable_is_read(tmp_path: Path):
    weights = tmp_path / "w.json"
    weights.write_text(json.dumps({"gold": 4, "silver": 2, "a=b,c": 3}))
    env = {
        "VTC_TENANT_KEY": " org ",
        "VTC_WEIGHTS": "gold=3, free=0.5,,",
        "VTC_WEIGHTS_FILE": str(weights),
        "VTC_WEIGHTS_RELOAD": "2.5",
        "VTC_PRIORITY_WEIGHTS": " 0=4, -3=0.5,, 9=1 ",
        "VTC_WP": "0.5",
        "VTC_WQ": " 3 ",
        "VTC_MAX_TENANTS": "7",
        "VTC_LOG_INTERVAL": "0",
        "VTC_TRACE_FILE": str(tmp_path / "trace.jsonl"),
        "VTC_TRACE_INTERVAL": "0.25",
        "VTC_METRICS": " ON ",
        "VTC_METRICS_MAX_TENANTS": "12",
        "VTC_METRICS_INTERVAL": "0.5",
        "VTC_METRICS_RELABEL_INTERVAL": "30",
        "VTC_LOCALITY_QUANTUM": " 4096.5 ",
    }
    assert set(env) == set(C.VARIABLES)
    cfg = EngineConfig.from_env(env)
    assert cfg.tenant_key == "org"
    # the variable wins over the file for the same tenant
    assert dict(cfg.weights) == {"gold": 3.0, "silver": 2.0, "a=b,c": 3.0, "free": 0.5}
    assert (cfg.weights_file, cfg.weights_reload) == (str(weights), 2.5)
    assert dict(cfg.priority_weights) == {0: 4.0, -3: 0.5, 9: 1.0}
    assert dict(cfg.env_weights) == {"gold": 3.0, "free": 0.5}
    assert (cfg.wp, cfg.wq, cfg.max_tenants) == (0.5, 3.0, 7)
    assert (cfg.log_interval, cfg.trace_interval) == (0.0, 0.25)
    assert cfg.trace_file == str(tmp_path / "trace.jsonl")
    assert (cfg.metrics, cfg.metrics_max_tenants, cfg.metrics_interval) == ("on", 12, 0.5)
    assert cfg.metrics_relabel_interval == 30.0
    assert cfg.locality_quantum == 4096.5


@pytest.mark.parametrize(
    "text, mode",
    [("auto", "auto"), ("1", "on"), ("True", "on"), ("yes", "on"), ("0", "off"), ("No", "off")],
)
def test_metrics_modes(text, mode):
    assert EngineConfig.from_env({"VTC_METRICS": text}).metrics == mode
    assert EngineConfig().metrics == "auto"
    with pytest.raises(ConfigError, match="expected 'auto', 'on' or 'off'"):
        EngineConfig(metrics="maybe")


def test_from_env_reads_os_environ(monkeypatch):
    monkeypatch.setenv("VTC_WQ", "4")
    assert EngineConfig.from_env().wq == 4.0


BAD = [
    ({"VTC_WP": "abc"}, "VTC_WP='abc' is not a number"),
    ({"VTC_WQ": "-1"}, "VTC_WQ='-1' is out of range; expected a number in [0, 1e+09]"),
    ({"VTC_WQ": "nan"}, "VTC_WQ='nan' is out of range"),
    ({"VTC_WP": "inf"}, "VTC_WP='inf' is out of range"),
    ({"VTC_WP": "2e9"}, "VTC_WP='2e9' is out of range"),
    ({"VTC_WP": "0", "VTC_WQ": "0"}, "VTC_WP and VTC_WQ are both 0"),
    ({"VTC_MAX_TENANTS": "0"}, "VTC_MAX_TENANTS='0' is out of range"),
    ({"VTC_MAX_TENANTS": "2.5"}, "VTC_MAX_TENANTS='2.5' is not an integer"),
    ({"VTC_MAX_TENANTS": "many"}, "VTC_MAX_TENANTS='many' is not an integer"),
    ({"VTC_LOG_INTERVAL": "soon"}, "VTC_LOG_INTERVAL='soon' is not a number"),
    ({"VTC_LOG_INTERVAL": "-1"}, "VTC_LOG_INTERVAL='-1' is out of range"),
    ({"VTC_TRACE_INTERVAL": "x"}, "VTC_TRACE_INTERVAL='x' is not a number"),
    ({"VTC_TRACE_INTERVAL": "inf"}, "VTC_TRACE_INTERVAL='inf' is out of range"),
    ({"VTC_METRICS": "maybe"}, "VTC_METRICS='maybe' is not a mode; expected auto, on"),
    ({"VTC_METRICS_MAX_TENANTS": "0"}, "VTC_METRICS_MAX_TENANTS='0' is out of range"),
    ({"VTC_METRICS_INTERVAL": "-2"}, "VTC_METRICS_INTERVAL='-2' is out of range"),
    ({"VTC_METRICS_RELABEL_INTERVAL": "x"}, "VTC_METRICS_RELABEL_INTERVAL='x' is not a number"),
    ({"VTC_METRICS_RELABEL_INTERVAL": "inf"}, "VTC_METRICS_RELABEL_INTERVAL='inf' is out of"),
    ({"VTC_WEIGHTS": "gold=2;free=1"}, "weight '2;free=1' is not a number"),
    ({"VTC_WEIGHTS": "gold"}, "VTC_WEIGHTS entry 'gold' has no '='"),
    ({"VTC_WEIGHTS": "a="}, "weight '' is not a number"),
    ({"VTC_WEIGHTS": "=2"}, "'' is not a tenant name"),
    ({"VTC_WEIGHTS": "team=x=2"}, "weight 'x=2' is not a number"),
    ({"VTC_WEIGHTS": "a=0"}, "weight of tenant 'a' is '0'"),
    ({"VTC_WEIGHTS": "a=-1"}, "weight of tenant 'a' is '-1'"),
    ({"VTC_WEIGHTS": "a=nan"}, "weight of tenant 'a' is 'nan'"),
    ({"VTC_WEIGHTS": "a=inf"}, "weight of tenant 'a' is 'inf'"),
    ({"VTC_WEIGHTS": "a=1e-300"}, "weight of tenant 'a' is '1e-300'"),
    ({"VTC_WEIGHTS": "a=1,a=2"}, "tenant 'a' is given twice"),
    ({"VTC_WEIGHTS": "x" * 129 + "=2"}, "is not a tenant name (1 to 128 characters)"),
    ({"VTC_PRIORITY_WEIGHTS": "0=4;1=1"}, "weight '4;1=1' is not a number"),
    ({"VTC_PRIORITY_WEIGHTS": "urgent=4"}, "priority 'urgent' is not an integer"),
    ({"VTC_PRIORITY_WEIGHTS": "1.5=4"}, "priority '1.5' is not an integer"),
    ({"VTC_PRIORITY_WEIGHTS": "0"}, "VTC_PRIORITY_WEIGHTS entry '0' has no '='"),
    ({"VTC_PRIORITY_WEIGHTS": "0=4,0=1"}, "priority 0 is given twice"),
    ({"VTC_PRIORITY_WEIGHTS": "0=0"}, "weight of priority 0 is '0'"),
    ({"VTC_PRIORITY_WEIGHTS": "0=nan"}, "weight of priority 0 is 'nan'"),
    ({"VTC_PRIORITY_WEIGHTS": "0=1e-300"}, "weight of priority 0 is '1e-300'"),
    ({"VTC_PRIORITY_WEIGHTS": f"{2**63}=2"}, f"priority {2**63} does not fit in 64 bits"),
    (
        {"VTC_LOCALITY_QUANTUM": "-1"},
        "VTC_LOCALITY_QUANTUM='-1' is out of range; expected a finite number >= 0",
    ),
    ({"VTC_LOCALITY_QUANTUM": "nan"}, "VTC_LOCALITY_QUANTUM='nan' is out of range"),
    ({"VTC_LOCALITY_QUANTUM": "inf"}, "VTC_LOCALITY_QUANTUM='inf' is out of range"),
    ({"VTC_LOCALITY_QUANTUM": "-inf"}, "VTC_LOCALITY_QUANTUM='-inf' is out of range"),
    ({"VTC_LOCALITY_QUANTUM": "abc"}, "VTC_LOCALITY_QUANTUM='abc' is not a number"),
    ({"VTC_LOCALITY_QUANTUM": "1e400"}, "VTC_LOCALITY_QUANTUM='1e400' is out of range"),
]


@pytest.mark.parametrize(("env", "message"), BAD, ids=[repr(e) for e, _ in BAD])
def test_a_malformed_value_names_the_variable_and_the_value(env, message):
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_env(env)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)
    assert any(name in str(info.value) for name in env)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "holds a JSON list; expected an object"),
        ('{"a": "heavy"}', "weight of tenant 'a' is 'heavy', not a number"),
        ('{"a": "2"}', "weight of tenant 'a' is '2', not a number"),
        ('{"a": true}', "weight of tenant 'a' is True, not a number"),
        ('{"a": 0}', "weight of tenant 'a' is 0"),
        ('{"a": 1e400}', "weight of tenant 'a' is inf"),
        ('{"a": 1' + "0" * 400 + "}", "weight of tenant 'a' is"),
        ('{"": 2}', "'' is not a tenant name"),
        ('{"a": 1, "a": 2}', "tenant 'a' is given twice"),
        ("{not json", "is not valid JSON (line 1, column 2"),
        ("", "is not valid JSON"),
    ],
)
def test_a_malformed_weights_file_names_its_path(tmp_path: Path, content, message):
    path = tmp_path / "weights.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        EngineConfig.from_env({"VTC_WEIGHTS_FILE": str(path)})
    assert f"VTC_WEIGHTS_FILE {str(path)!r}" in str(info.value)
    assert message in str(info.value)


def test_an_unreadable_weights_file_names_its_path(tmp_path: Path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="nope.json.*cannot be read"):
        EngineConfig.from_env({"VTC_WEIGHTS_FILE": str(missing)})
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{")
    with pytest.raises(ConfigError, match="bin.json"):
        EngineConfig.from_env({"VTC_WEIGHTS_FILE": str(binary)})


def test_parse_weights_alone():
    assert C.parse_weights(None) == {} and C.parse_weights("") == {}
    assert C.parse_weights(" a=2 ,b = 0.5,,") == {"a": 2.0, "b": 0.5}
    assert C.parse_weights("42=3") == {"42": 3.0}
    assert C.parse_weights("a=1e6, b=1e-6") == {"a": 1e6, "b": 1e-6}
    with pytest.raises(ConfigError, match="MY_VAR entry 'a'"):
        C.parse_weights("a", variable="MY_VAR")


# -- the tenant rule -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("acme", "acme"),
        (42, "42"),
        (0, "0"),
        (-3, "-3"),
        ("x" * 128, "x" * 128),
        ("x" * 129, None),
        ("", None),
        (True, None),
        (False, None),
        (3.5, None),
        (None, None),
        (["a"], None),
        ({"a": 1}, None),
        (b"acme", None),
    ],
)
def test_what_names_a_tenant(value, name):
    assert C.tenant_name(value) == name


def test_the_first_field_that_names_a_tenant_decides():
    assert C.first_tenant(["a", "b"]) == "a"
    assert C.first_tenant([None, "b"]) == "b"
    assert C.first_tenant([{"bad": 1}, True, "", 7]) == "7"  # malformed is absent
    assert C.first_tenant([]) is None
    assert C.first_tenant([None, ["x"]]) is None
    cfg = EngineConfig()
    assert cfg.tenant([None, "x" * 500]) == "default"
    assert cfg.tenant(iter([None, "b"])) == "b"


def test_the_module_imports_without_an_engine():
    assert "vllm" not in sys.modules and "sglang" not in sys.modules


# -- shared counters (VTC_REDIS_*, VTC_SYNC_*, VTC_REPLICA_ID) -------------------------------


def test_shared_counters_are_off_without_a_url():
    assert C.shared_counter_settings({}) is None
    assert C.shared_counter_settings({"VTC_REDIS_URL": "  ", "VTC_SYNC_INTERVAL": "5"}) is None


def test_shared_counter_defaults_and_every_variable():
    url = "redis://10.0.0.5:6379/0"
    assert C.shared_counter_settings({"VTC_REDIS_URL": url}) == C.SharedCounterSettings(
        url=url, namespace="default", sync_interval=10, sync_ms=None, replica_id=None,
        timeout_ms=100.0,
    )  # fmt: skip
    env = {
        "VTC_REDIS_URL": " rediss://user:pw@redis.example:6380/2 ",
        "VTC_REDIS_NAMESPACE": " prod ",  # (256 characters are allowed: below)
        "VTC_SYNC_INTERVAL": " 4 ",
        "VTC_SYNC_MS": "25.5",
        "VTC_REPLICA_ID": " r-1 ",
        "VTC_REDIS_TIMEOUT_MS": "250",
        "VTC_SYNC_MODE": " Step ",
        "VTC_SYNC_LIVENESS_MS": "2500.5",
        "VTC_SYNC_RETRY_MS": " 200 ",
        "VTC_SYNC_FORGET_MS": "1500.2",
        "VTC_SYNC_CPU_SHARE": " 0.25 ",
    }
    assert set(env) == set(C.SHARED_VARIABLES)
    ignored = (
        "VTC_SYNC_CPU_SHARE='0.25' is ignored: VTC_SYNC_MODE=step syncs on the engine "
        "thread every VTC_SYNC_INTERVAL steps; the share bounds the background thread's "
        "syncs (VTC_SYNC_MODE=background)",
    )
    assert C.shared_counter_settings(env) == C.SharedCounterSettings(
        url="rediss://user:pw@redis.example:6380/2", namespace="prod", sync_interval=4,
        sync_ms=25.5, replica_id="r-1", timeout_ms=250.0, mode="step", liveness_ms=2501,
        retry_ms=200.0, forget_ms=1501, cpu_share=0.25, ignored=ignored,
    )  # fmt: skip
    background = {**env, "VTC_SYNC_MODE": "background", "VTC_SYNC_INTERVAL": " "}
    settings = C.shared_counter_settings(background)
    assert settings is not None and settings.cpu_share == 0.25 and settings.ignored == ()
    assert C.shared_counter_settings({**background, "VTC_SYNC_CPU_SHARE": "1"}).cpu_share == 1.0
    assert C.EngineConfig.from_env(env).shared == C.shared_counter_settings(env)
    assert C.EngineConfig.from_env({}).shared is None
    longest = {"VTC_REDIS_URL": url, "VTC_REDIS_NAMESPACE": "n" * 256}
    assert C.shared_counter_settings(longest).namespace == "n" * 256
    blank = {name: " " for name in C.SHARED_VARIABLES}
    assert C.shared_counter_settings({**blank, "VTC_REDIS_URL": "unix:///run/r.sock"}) == (
        C.SharedCounterSettings(url="unix:///run/r.sock")
    )


BAD_SHARED = [
    ({"VTC_REDIS_URL": "10.0.0.5:6379"}, "VTC_REDIS_URL='10.0.0.5:6379' has no scheme"),
    ({"VTC_REDIS_URL": "http://h:6379"}, r"VTC_REDIS_URL='http://h:6379' has scheme 'http'.*redis://"),
    ({"VTC_REDIS_URL": "redis://h:port/0"}, "VTC_REDIS_URL='redis://h:port/0' is not a URL"),
    ({"VTC_REDIS_URL": "unix://"}, "VTC_REDIS_URL='unix://' names no socket path"),
    ({"VTC_SYNC_MODE": "often"}, "VTC_SYNC_MODE='often'; expected 'background'"),
    ({"VTC_REDIS_NAMESPACE": "a}b"}, r"NAMESPACE='a}b' is not a namespace.*without '\{' or '\}'"),
    ({"VTC_REDIS_NAMESPACE": "{x"}, r"VTC_REDIS_NAMESPACE='\{x' is not a namespace"),
    ({"VTC_REDIS_NAMESPACE": "n" * 257}, "='n{257}' is not a namespace; expected at most 256"),
    ({"VTC_SYNC_INTERVAL": "abc"}, "VTC_SYNC_INTERVAL='abc' is not an integer; expected an int"),
    ({"VTC_SYNC_INTERVAL": "2.5"}, "VTC_SYNC_INTERVAL='2.5' is not an integer"),
    ({"VTC_SYNC_INTERVAL": "0"}, "VTC_SYNC_INTERVAL='0' is out of range; expected an integer >= 1"),
    ({"VTC_SYNC_MS": "fast"}, "VTC_SYNC_MS='fast' is not a number; expected a finite number > 0"),
    ({"VTC_SYNC_MS": "0"}, "VTC_SYNC_MS='0' is out of range; expected a finite number > 0"),
    ({"VTC_SYNC_MS": "inf"}, "VTC_SYNC_MS='inf' is out of range"),
    ({"VTC_REDIS_TIMEOUT_MS": "-5"}, "VTC_REDIS_TIMEOUT_MS='-5' is out of range"),
    ({"VTC_REDIS_TIMEOUT_MS": "nan"}, "VTC_REDIS_TIMEOUT_MS='nan' is out of range"),
    ({"VTC_SYNC_LIVENESS_MS": "0"}, "VTC_SYNC_LIVENESS_MS='0' is out of range; expected a finite"),
    ({"VTC_SYNC_LIVENESS_MS": "soon"}, "VTC_SYNC_LIVENESS_MS='soon' is not a number"),
    ({"VTC_SYNC_LIVENESS_MS": "40"}, "=.40. is out of range: a replica syncs every 50 ms"),
    ({"VTC_SYNC_LIVENESS_MS": "900", "VTC_SYNC_MS": "1000"}, "LIVENESS_MS='900' .* every 1000 ms"),
    ({"VTC_SYNC_MS": "20000"}, r"LIVENESS_MS=unset \(10000\) is out of range.* every 20000 ms"),
    ({"VTC_SYNC_RETRY_MS": "-1"}, "VTC_SYNC_RETRY_MS='-1' is out of range"),
    ({"VTC_SYNC_FORGET_MS": "0"}, "VTC_SYNC_FORGET_MS='0' is out of range"),
    ({"VTC_SYNC_FORGET_MS": "inf"}, "VTC_SYNC_FORGET_MS='inf' is out of range"),
    ({"VTC_SYNC_CPU_SHARE": "0"}, r"_SHARE='0' is out of range; expected a number in \(0, 1\]"),
    ({"VTC_SYNC_CPU_SHARE": "1.5"}, "VTC_SYNC_CPU_SHARE='1.5' is out of range"),
    ({"VTC_SYNC_CPU_SHARE": "nan"}, "VTC_SYNC_CPU_SHARE='nan' is out of range"),
    ({"VTC_SYNC_CPU_SHARE": "1%"}, "VTC_SYNC_CPU_SHARE='1%' is not a number; expected a number in"),
]  # fmt: skip


@pytest.mark.parametrize("with_url", [True, False])
@pytest.mark.parametrize("env, message", BAD_SHARED)
def test_a_malformed_shared_counter_variable_names_itself(env, message, with_url):
    """Refused with or without a URL: a bad value is not ignored until the URL is added."""
    if with_url and "VTC_REDIS_URL" not in env:
        env = {**env, "VTC_REDIS_URL": "redis://localhost:6379/0"}
    with pytest.raises(ConfigError, match=message):
        C.shared_counter_settings(env)
    with pytest.raises(ConfigError, match=message):
        C.check_env(env)


def test_check_env_validates_both_sets_and_returns_the_engine_config():
    assert C.check_env({"VTC_WQ": "3", "VTC_SYNC_INTERVAL": "2"}) == EngineConfig(wq=3.0)
    with pytest.raises(ConfigError, match="VTC_WP='abc'"):
        C.check_env({"VTC_WP": "abc", "VTC_SYNC_INTERVAL": "2"})


def test_shared_counter_settings_read_os_environ(monkeypatch):
    monkeypatch.setenv("VTC_REDIS_URL", "redis://r:1/0")
    monkeypatch.setenv("VTC_SYNC_INTERVAL", "3")
    monkeypatch.setenv("VTC_SYNC_MODE", "step")
    expected = C.SharedCounterSettings(url="redis://r:1/0", sync_interval=3, mode="step")
    assert C.shared_counter_settings() == expected


# -- the vLLM start-up plugin (vtc.vllm_plugin, entry point vllm.general_plugins) ----------


def _vtc_free_environ(monkeypatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("VTC_"):
            monkeypatch.delenv(name)


def test_the_plugin_does_nothing_without_vtc_variables(monkeypatch, tmp_path: Path):
    from vtc import vllm_plugin

    _vtc_free_environ(monkeypatch)
    calls = []
    monkeypatch.setattr(C, "check_env", lambda env=None: calls.append(env))
    assert vllm_plugin.validate() is None
    assert vllm_plugin.validate({"HOME": "/root", "VLLM_X": "abc", "XVTC_WP": "abc"}) is None
    assert calls == []  # nothing was read: a server without VTC is not affected
    monkeypatch.setenv("VTC_WP", "2")
    vllm_plugin.validate()
    assert len(calls) == 1


@pytest.mark.parametrize(
    "env, message",
    [
        ({"VTC_WP": "abc"}, "VTC_WP='abc' is not a number"),
        ({"VTC_WEIGHTS": "gold=2;free=1"}, "VTC_WEIGHTS entry 'gold=2;free=1'"),
        ({"VTC_TENANT_KEY": "org", "VTC_SYNC_MS": "x"}, "VTC_SYNC_MS='x' is not a number"),
        ({"VTC_REDIS_URL": "localhost"}, "VTC_REDIS_URL='localhost' has no scheme"),
    ],
)
def test_the_plugin_refuses_a_malformed_variable(monkeypatch, env, message):
    from vtc import vllm_plugin

    _vtc_free_environ(monkeypatch)
    with pytest.raises(ConfigError, match=message):
        vllm_plugin.validate(env)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        vllm_plugin.validate()  # os.environ, as vLLM calls it


def test_the_plugin_accepts_a_good_configuration_and_a_blank_one(monkeypatch):
    from vtc import vllm_plugin

    _vtc_free_environ(monkeypatch)
    assert vllm_plugin.validate({"VTC_WP": "", "VTC_E2E_SERVER_ARGS": "--x"}) is None
    good = {"VTC_WEIGHTS": "gold=2", "VTC_REDIS_URL": "redis://r:6379/0", "VTC_SYNC_MS": "50"}
    assert vllm_plugin.validate(good) is None


def test_the_plugin_is_declared_as_a_vllm_general_plugin():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    entry_points = project["project"]["entry-points"]
    assert entry_points["vllm.general_plugins"] == {"vtc": "vtc.vllm_plugin:validate"}


def test_the_plugin_imports_neither_vllm_nor_torch():
    import subprocess

    probe = "import sys, vtc.vllm_plugin; print(sorted({'vllm', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_priority_weights_unset_or_empty_are_strict_bands():
    assert EngineConfig.from_env({}).priority_weights is None
    assert C.parse_priority_weights(" , ,") is None
    assert C.parse_priority_weights("+2=3,-1=1") == {2: 3.0, -1: 1.0}


@pytest.mark.parametrize(("text", "q"), [("0", 0.0), ("0.0", 0.0), ("256", 256.0), ("1e5", 1e5)])
def test_locality_quantum_values(text, q):
    """VTC_LOCALITY_QUANTUM: weighted tokens, a finite number >= 0; unset is 0 (plain
    VTC), and the core accepts every value the parser does."""
    assert EngineConfig.from_env({}).locality_quantum == 0.0
    cfg = EngineConfig.from_env({"VTC_LOCALITY_QUANTUM": text})
    assert cfg.locality_quantum == q
    from vtc import Scheduler

    assert Scheduler(1, locality_quantum=cfg.locality_quantum).locality_quantum == q
