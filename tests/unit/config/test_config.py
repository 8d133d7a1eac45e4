"""The config file: every key with its default, `${VAR}` expansion, paths, and errors that name the key."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy.config.models import ModelEntry
from proxy.config.schema import (
    DEFAULT_KEEP_EVENTS_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SOCKETS_PER_KEY,
    DEFAULT_SOCKET_IDLE_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    Config,
    ConfigError,
    RequestLimits,
    load_config,
    parse_config,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
BASE = Path("/srv/proxy")
MODEL: dict[str, Any] = {"name": "m", "model": "openai/gpt-4o"}


def parse(raw: Any, environ: dict[str, str] | None = None) -> Config:
    return parse_config(raw, base_dir=BASE, environ=environ or {})


def with_model(**sections: Any) -> dict[str, Any]:
    return {"models": [dict(MODEL)], **sections}


def test_empty_config_has_every_default() -> None:
    config = parse({})

    assert config.server.host == "127.0.0.1"
    assert config.server.port == 8787
    assert config.server.header_timeout_s == 30.0
    assert config.server.body_timeout_s == 120.0
    assert config.server.keep_alive_s == 75.0
    assert config.server.max_connections is None
    assert config.server.socket_idle_timeout_s == DEFAULT_SOCKET_IDLE_TIMEOUT_S == 300.0
    assert config.server.max_sockets_per_key == DEFAULT_MAX_SOCKETS_PER_KEY == 64
    assert config.store.path == BASE / "context-infinity.db"
    assert config.models == ()
    assert config.context.preserve_recent == 4
    assert config.context.target_ratio == 0.15
    assert config.context.safety_margin == 0.05
    assert config.context.trigger_ratio == 1.0
    assert config.context.compact_to == 0.55
    assert config.context.summarizer_model is None
    assert config.journal.synchronous == "NORMAL"
    assert config.journal.finish_on_disconnect is True
    assert config.journal.keep_events_s == DEFAULT_KEEP_EVENTS_S == 24 * 3600
    assert config.request_limits.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 32 * 1024 * 1024
    assert config.upstream.timeout_s == DEFAULT_TIMEOUT_S == 600.0
    assert config.upstream.num_retries == 0
    assert config.auth.keys == ()
    assert config.auth.enabled is False


def test_null_file_and_null_sections_are_defaults(tmp_path: Path) -> None:
    file = tmp_path / "empty.yaml"
    file.write_text("")
    assert load_config(file, environ={}) == parse_config({}, base_dir=tmp_path, environ={})
    assert parse({"server": None, "context": None}).server.port == 8787


def test_every_key_is_parsed() -> None:
    config = parse(
        {
            "server": {
                "host": "0.0.0.0",
                "port": 9000,
                "header_timeout_s": 5,
                "body_timeout_s": 60.5,
                "keep_alive_s": 120,
                "max_connections": 500,
                "socket_idle_timeout_s": 30,
                "max_sockets_per_key": 4,
            },
            "store": {"path": "/var/lib/ci/store.db"},
            "models": [
                {
                    "name": "big",
                    "model": "openai/gpt-4o",
                    "api_base": "http://127.0.0.1:1/v1",
                    "api_key": "sk-1",
                    "context_window": 100_000,
                    "max_output": 2_000,
                },
                {"name": "small", "model": "anthropic/claude-3-5-haiku"},
            ],
            "context": {
                "preserve_recent": 6,
                "target_ratio": 0.2,
                "safety_margin": 0.1,
                "trigger_ratio": 0.9,
                "compact_to": 0.5,
                "summarizer_model": "small",
            },
            "journal": {"synchronous": "full", "finish_on_disconnect": False, "keep_events": "30m"},
            "limits": {
                "max_body_bytes": 4096,
                "max_messages": 7,
                "max_message_chars": 2048,
                "max_answer_chars": 3000,
                "max_body_values": 5000,
            },
            "upstream": {"timeout_s": 12.5, "num_retries": 2},
            "auth": {"keys": ["k1", "k2"]},
        }
    )

    assert (config.server.host, config.server.port) == ("0.0.0.0", 9000)
    assert (config.server.header_timeout_s, config.server.body_timeout_s) == (5.0, 60.5)
    assert (config.server.keep_alive_s, config.server.max_connections) == (120.0, 500)
    assert (config.server.socket_idle_timeout_s, config.server.max_sockets_per_key) == (30.0, 4)
    assert config.store.path == Path("/var/lib/ci/store.db")
    assert config.models == (
        ModelEntry("big", "openai/gpt-4o", "http://127.0.0.1:1/v1", "sk-1", 100_000, 2_000),
        ModelEntry("small", "anthropic/claude-3-5-haiku"),
    )
    assert config.model("small") == config.models[1]
    assert config.model("absent") is None
    context = config.context
    assert (context.preserve_recent, context.target_ratio, context.safety_margin) == (6, 0.2, 0.1)
    assert (context.trigger_ratio, context.compact_to, context.summarizer_model) == (0.9, 0.5, "small")
    assert config.journal.synchronous == "FULL"
    assert config.journal.finish_on_disconnect is False
    assert config.journal.keep_events_s == 1800.0
    assert config.request_limits == RequestLimits(4096, 7, 2048, 3000, 5000)
    assert (config.upstream.timeout_s, config.upstream.num_retries) == (12.5, 2)
    assert config.auth.keys == ("k1", "k2")
    assert config.auth.enabled is True


def test_model_api_key_is_not_in_repr() -> None:
    config = parse({"models": [{**MODEL, "api_key": "sk-very-secret"}], "auth": {"keys": ["proxy-secret"]}})
    assert "sk-very-secret" not in repr(config)
    assert "proxy-secret" not in repr(config)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("90", 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("24h", 86400.0),
        ("7d", 604800.0),
        ("forever", None),
        ("1.5h", 5400.0),
    ],
)
def test_keep_events_durations(text: str, seconds: float | None) -> None:
    assert parse({"journal": {"keep_events": text}}).journal.keep_events_s == seconds


def test_env_references_are_expanded() -> None:
    environ = {"PROXY_PORT": "9100", "UPSTREAM_KEY": "sk-from-env", "HOST_PART": "10.0.0"}
    config = parse(
        {
            "server": {"host": "${HOST_PART}.1", "port": "${PROXY_PORT}"},
            "models": [
                {**MODEL, "api_key": "${UPSTREAM_KEY}", "api_base": "${UPSTREAM_BASE:-http://localhost:8000/v1}"},
            ],
            "auth": {"keys": ["${PROXY_KEY:-fallback-key}", "${UPSTREAM_KEY}"]},
            "upstream": {"timeout_s": "${TIMEOUT:-30}"},
        },
        environ,
    )

    assert config.server.host == "10.0.0.1"
    assert config.server.port == 9100
    assert config.models[0].api_key == "sk-from-env"
    assert config.models[0].api_base == "http://localhost:8000/v1"
    assert config.auth.keys == ("fallback-key", "sk-from-env")
    assert config.upstream.timeout_s == 30.0


def test_set_variable_wins_over_default_and_unset_variable_is_empty() -> None:
    config = parse(
        {"models": [{**MODEL, "api_base": "${BASE:-http://default}", "api_key": "${NOT_SET_ANYWHERE}"}]},
        {"BASE": "http://from-env"},
    )
    assert config.models[0].api_base == "http://from-env"
    assert config.models[0].api_key is None


def test_relative_store_path_is_taken_from_the_config_folder(tmp_path: Path) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    file = folder / "proxy.yaml"
    file.write_text("store:\n  path: data/store.db\n")

    config = load_config(file, environ={})

    assert config.store.path == folder.resolve() / "data" / "store.db"
    assert config.store.path.is_absolute()


def test_default_store_path_is_next_to_the_config_file(tmp_path: Path) -> None:
    file = tmp_path / "proxy.yaml"
    file.write_text("server:\n  port: 1234\n")
    assert load_config(file, environ={}).store.path == tmp_path.resolve() / "context-infinity.db"


def test_absolute_store_path_is_kept(tmp_path: Path) -> None:
    file = tmp_path / "proxy.yaml"
    file.write_text(f"store:\n  path: {tmp_path / 'elsewhere' / 's.db'}\n")
    assert load_config(file, environ={}).store.path == tmp_path / "elsewhere" / "s.db"


def test_json_config_file_works(tmp_path: Path) -> None:
    raw = {
        "server": {"port": 9001},
        "store": {"path": "s.db"},
        "models": [{"name": "x", "model": "openai/x", "api_key": "${KEY}", "context_window": 4096}],
        "context": {"preserve_recent": 2},
        "auth": {"keys": ["k"]},
    }
    file = tmp_path / "proxy.json"
    file.write_text(json.dumps(raw, indent=2))

    config = load_config(file, environ={"KEY": "sk-json"})

    assert config.server.port == 9001
    assert config.store.path == tmp_path.resolve() / "s.db"
    assert config.models == (ModelEntry("x", "openai/x", api_key="sk-json", context_window=4096),)
    assert config.context.preserve_recent == 2
    assert config.auth.keys == ("k",)


def test_example_config_loads_without_provider_keys() -> None:
    config = load_config(REPO_ROOT / "proxy.example.yaml", environ={})

    assert [m.name for m in config.models] == ["gpt-4o", "gpt-4o-mini"]
    assert all(m.api_key is None for m in config.models)
    assert config.context.summarizer_model == "gpt-4o-mini"
    assert config.store.path == REPO_ROOT / "data" / "context-infinity.db"
    assert config.server == parse({}).server
    assert config.request_limits == parse({}).request_limits
    assert config.upstream == parse({}).upstream
    assert config.journal == parse({}).journal
    assert config.auth.enabled is False
    assert config.store.retention_days is None
    assert config.store.tenant_retention_days == ()


def test_example_config_takes_the_key_from_the_environment() -> None:
    config = load_config(REPO_ROOT / "proxy.example.yaml", environ={"OPENAI_API_KEY": "sk-example"})
    assert [m.api_key for m in config.models] == ["sk-example", "sk-example"]


@pytest.mark.parametrize(
    ("raw", "key", "problem"),
    [
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"server": {"hots": "x"}}, "server.hots", "unknown key"),
        ({"context": {"preserve": 3}}, "context.preserve", "unknown key"),
        ({"journal": {"keep_events_s": 3}}, "journal.keep_events_s", "unknown key"),
        ({"store": {"retention_days": 0}}, "store.retention_days", "at least 1"),
        ({"store": {"tenant_retention_days": ["key-a"]}}, "store.tenant_retention_days", "map tenant ids"),
        ({"store": {"tenant_retention_days": {"key-a": "soon"}}}, "store.tenant_retention_days.key-a", "whole number"),
        ({"models": [{**MODEL, "apikey": "k"}]}, "models[0].apikey", "unknown key"),
        ({"server": {"port": "eighty"}}, "server.port", "whole number"),
        ({"server": {"port": 1.5}}, "server.port", "whole number"),
        ({"server": {"port": True}}, "server.port", "whole number"),
        ({"server": {"host": ["a"]}}, "server.host", "string"),
        ({"server": "localhost"}, "server", "mapping"),
        ({"models": {"name": "m"}}, "models", "list"),
        ({"models": ["m"]}, "models[0]", "mapping"),
        ({"context": {"target_ratio": "much"}}, "context.target_ratio", "number"),
        ({"context": {"safety_margin": True}}, "context.safety_margin", "number"),
        ({"journal": {"finish_on_disconnect": "yes"}}, "journal.finish_on_disconnect", "true or false"),
        ({"journal": {"synchronous": "OFF"}}, "journal.synchronous", "NORMAL, FULL"),
        ({"journal": {"keep_events": "a week"}}, "journal.keep_events", "duration"),
        ({"auth": {"keys": "k1"}}, "auth.keys", "list of strings"),
        ({"auth": {"keys": [1, 2]}}, "auth.keys", "list of strings"),
        ({"server": {"port": 70000}}, "server.port", "at most 65535"),
        ({"server": {"port": -1}}, "server.port", "at least 0"),
        ({"server": {"header_timeout_s": 0}}, "server.header_timeout_s", "between"),
        ({"server": {"body_timeout_s": "slow"}}, "server.body_timeout_s", "number"),
        ({"server": {"max_connections": 0}}, "server.max_connections", "at least 1"),
        ({"server": {"socket_idle_timeout_s": 0}}, "server.socket_idle_timeout_s", "between"),
        ({"server": {"max_sockets_per_key": 0}}, "server.max_sockets_per_key", "at least 1"),
        ({"server": {"max_sockets_per_key": 2.5}}, "server.max_sockets_per_key", "whole number"),
        ({"context": {"preserve_recent": -1}}, "context.preserve_recent", "at least 0"),
        ({"context": {"target_ratio": 1.5}}, "context.target_ratio", "between"),
        ({"context": {"safety_margin": 0.9}}, "context.safety_margin", "between"),
        ({"context": {"trigger_ratio": 0.01}}, "context.trigger_ratio", "between"),
        ({"context": {"compact_to": 0.0}}, "context.compact_to", "between"),
        ({"limits": {"max_body_bytes": 10}}, "limits.max_body_bytes", "at least 1024"),
        ({"limits": {"max_messages": 0}}, "limits.max_messages", "at least 1"),
        ({"limits": {"max_message_chars": 10}}, "limits.max_message_chars", "at least 1024"),
        ({"limits": {"max_answer_chars": "lots"}}, "limits.max_answer_chars", "whole number"),
        ({"upstream": {"timeout_s": 0}}, "upstream.timeout_s", "between"),
        ({"upstream": {"num_retries": 11}}, "upstream.num_retries", "at most 10"),
        ({"models": [{**MODEL, "context_window": 100}]}, "models[0].context_window", "at least 256"),
        ({"models": [{**MODEL, "max_output": 0}]}, "models[0].max_output", "at least 1"),
        ({"models": [{"model": "openai/x"}]}, "models[0].name", "required"),
        ({"models": [MODEL, {"name": "", "model": "openai/x"}]}, "models[1].name", "required"),
        ({"models": [{"name": "m"}]}, "models[0].model", "required"),
        ({"models": [MODEL, {"name": "m", "model": "openai/other"}]}, "models[1].name", "listed twice"),
        (
            {"models": [{**MODEL, "context_window": 4096, "max_output": 4096}]},
            "models[0].max_output",
            "smaller than its context_window",
        ),
        (with_model(context={"summarizer_model": "cheap"}), "context.summarizer_model", "'cheap'"),
        ({"context": {"summarizer_model": "cheap"}}, "context.summarizer_model", "not the name"),
        ({"context": {"trigger_ratio": 0.6, "compact_to": 0.7}}, "context.compact_to", "trigger_ratio"),
    ],
)
def test_wrong_config_names_the_key(raw: dict[str, Any], key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(raw)
    message = str(caught.value)
    assert message.startswith(key), message
    assert problem in message


def test_compact_to_equal_to_trigger_ratio_is_allowed() -> None:
    context = parse({"context": {"trigger_ratio": 0.7, "compact_to": 0.7}}).context
    assert (context.trigger_ratio, context.compact_to) == (0.7, 0.7)


def test_max_output_just_below_context_window_is_allowed() -> None:
    entry = parse({"models": [{**MODEL, "context_window": 4096, "max_output": 4095}]}).models[0]
    assert (entry.context_window, entry.max_output) == (4096, 4095)


def test_unreadable_or_invalid_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml", environ={})
    broken = tmp_path / "broken.yaml"
    broken.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken, environ={})
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary, environ={})
    top_list = tmp_path / "list.yaml"
    top_list.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="config: must be a mapping"):
        load_config(top_list, environ={})


def test_observability_defaults_and_choices() -> None:
    default = parse({}).observability
    assert (default.metrics, default.metrics_require_key, default.ui) == (True, True, True)
    assert (default.log_format, default.log_level) == ("text", "INFO")

    chosen = parse(
        {
            "metrics": {"enabled": False, "require_key": False},
            "ui": {"enabled": False},
            "logging": {"format": "JSON", "level": "debug"},
        }
    ).observability
    assert (chosen.metrics, chosen.metrics_require_key, chosen.ui) == (False, False, False)
    assert (chosen.log_format, chosen.log_level) == ("json", "DEBUG")


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"logging": {"format": "xml"}}, "logging.format"),
        ({"logging": {"level": "loud"}}, "logging.level"),
        ({"logging": {"colour": True}}, "logging.colour"),
        ({"metrics": {"enabled": "sometimes"}}, "metrics.enabled"),
        ({"metrics": {"path": "/stats"}}, "metrics.path"),
        ({"ui": {"theme": "dark"}}, "ui.theme"),
    ],
)
def test_bad_observability_keys_are_named(raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(key)}"):
        parse(raw)


def test_an_empty_config_is_the_dataclasses_defaults() -> None:
    config = parse({})
    assert replace(config, store=Config().store) == Config()
    assert config.store.pool_size == Config().store.pool_size


@pytest.mark.parametrize("text", ["--5", "²", "1" * 5000, "+5", "5.0"])
def test_an_odd_integer_text_is_named_not_raised(text: str) -> None:
    with pytest.raises(ConfigError, match=r"server\.port: must be a whole number"):
        parse({"server": {"port": text}})
