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
        "VTC_WP": "0.5",
        "VTC_WQ": " 3 ",
        "VTC_MAX_TENANTS": "7",
        "VTC_LOG_INTERVAL": "0",
        "VTC_TRACE_FILE": str(tmp_path / "trace.jsonl"),
        "VTC_TRACE_INTERVAL": "0.25",
        "VTC_METRICS": " ON ",
        "VTC_METRICS_MAX_TENANTS": "12",
        "VTC_METRICS_INTERVAL": "0.5",
    }
    assert set(env) == set(C.VARIABLES)
    cfg = EngineConfig.from_env(env)
    assert cfg.tenant_key == "org"
    # the variable wins over the file for the same tenant
    assert dict(cfg.weights) == {"gold": 3.0, "silver": 2.0, "a=b,c": 3.0, "free": 0.5}
    assert (cfg.wp, cfg.wq, cfg.max_tenants) == (0.5, 3.0, 7)
    assert (cfg.log_interval, cfg.trace_interval) == (0.0, 0.25)
    assert cfg.trace_file == str(tmp_path / "trace.jsonl")
    assert (cfg.metrics, cfg.metrics_max_tenants, cfg.metrics_interval) == ("on", 12, 0.5)


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
