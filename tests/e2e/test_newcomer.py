"""A newcomer's first steps: the example config without a provider key, and looking a model up by id.

The proxy runs on the example config exactly as the README says to start it, with OPENAI_BASE_URL pointing
LiteLLM's OpenAI route at a local address instead of api.openai.com, so that no test needs the network: the
fake upstream answers 401 as OpenAI does without a key, and a free port refuses the connection as an offline
machine would.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from proxy import environment
from proxy.config.models import ModelEntry
from proxy.upstream.credentials import missing_keys
from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream, Fault, error_body
from tests.support.proxy_server import ProxyServer, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
OPENAI_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth "
    "(i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the "
    "API from your browser and are prompted for a username and password. You can obtain an API key from "
    "https://platform.openai.com/account/api-keys."
)
MESSAGES: list[Any] = [{"role": "user", "content": "hello"}]
KEY_WARNING = "No API key for model '{name}' ({model}): OPENAI_API_KEY is not set"
CONFIG_TAIL = " in the proxy's environment and its config entry has no api_key."


def example_config(tmp_path: Path) -> dict[str, Any]:
    """proxy.example.yaml as the newcomer runs it, with the store in the test's folder."""
    raw: dict[str, Any] = yaml.safe_load((REPO_ROOT / "proxy.example.yaml").read_text())
    raw["store"] = {"path": str(tmp_path / "store.db")}
    return raw


@pytest.fixture
def no_key(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return monkeypatch


def serve(raw: dict[str, Any], tmp_path: Path) -> ProxyServer:
    return ProxyServer(raw, tmp_path).__enter__()


def key_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and "No API key" in record.getMessage()
    ]


# --- the example config without OPENAI_API_KEY ----------------------------------------------------------------


def test_starting_without_the_key_warns_once_per_model(
    no_key: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    server = serve(example_config(tmp_path), tmp_path)
    try:
        warnings = key_warnings(caplog)
    finally:
        server.__exit__(None, None, None)

    expected = [("gpt-4o", "openai/gpt-4o"), ("gpt-4o-mini", "openai/gpt-4o-mini")]
    assert len(warnings) == len(expected)
    for warning, (name, model) in zip(warnings, expected, strict=True):
        assert warning.startswith(KEY_WARNING.format(name=name, model=model))
        assert "api_key" in warning


def test_no_warning_when_the_key_is_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    caplog.set_level(logging.WARNING)
    server = serve(example_config(tmp_path), tmp_path)
    server.__exit__(None, None, None)

    assert key_warnings(caplog) == []


def test_no_warning_for_a_local_server_or_a_configured_key(
    no_key: pytest.MonkeyPatch, serve_proxy: ServeProxy, fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    serve_proxy(
        models=[
            {"name": "local", "model": "openai/served-model", "api_base": fake.url},
            {"name": "keyed", "model": "openai/gpt-4o", "api_key": "sk-configured"},
            {"name": "vllm", "model": "hosted_vllm/served-model", "api_base": fake.url},
        ]
    )
    assert key_warnings(caplog) == []


@pytest.mark.parametrize("stream", [False, True])
def test_an_unreachable_upstream_without_a_key_says_both(
    no_key: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    no_key.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")  # an offline machine, hermetically
    server = serve(example_config(tmp_path), tmp_path)
    try:
        with (
            openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=20) as client,
            pytest.raises(openai.APIStatusError) as caught,
        ):
            if stream:
                with client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True) as chunks:
                    list(chunks)
            else:
                client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    finally:
        server.__exit__(None, None, None)

    assert (caught.value.status_code, caught.value.code) == (502, "upstream_unreachable")
    assert isinstance(caught.value.body, dict)
    message = caught.value.body["message"]
    assert message.startswith("The upstream model could not be reached (")
    assert "Connection refused" in message or "connection attempts failed" in message
    assert KEY_WARNING.format(name="gpt-4o", model="openai/gpt-4o") in message
    logged = [r.getMessage() for r in caplog.records if r.name == "proxy.upstream.failures"]
    assert any("gpt-4o" in line and "could not be reached" in line and "OPENAI_API_KEY" in line for line in logged)


def test_openais_401_without_a_key_names_the_proxys_missing_key(
    no_key: pytest.MonkeyPatch, tmp_path: Path, fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    no_key.setenv("OPENAI_BASE_URL", fake.url)
    fake.fail_next(Fault(status=401, body=error_body(OPENAI_NO_KEY, "invalid_request_error", None, None)))
    server = serve(example_config(tmp_path), tmp_path)
    try:
        with (
            openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=20) as client,
            pytest.raises(openai.AuthenticationError) as caught,
        ):
            client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    finally:
        server.__exit__(None, None, None)

    assert "authorization" not in fake.requests[0].headers
    assert isinstance(caught.value.body, dict)
    message = caught.value.body["message"]
    assert message.startswith(OPENAI_NO_KEY)  # the upstream's words first, then what the proxy knows
    assert message.endswith(KEY_WARNING.format(name="gpt-4o-mini", model="openai/gpt-4o-mini") + CONFIG_TAIL)
    logged = [r.getMessage() for r in caplog.records if r.name == "proxy.upstream.failures"]
    assert any(line.startswith("upstream refused the credentials for model gpt-4o-mini (401") for line in logged)
    assert not any(OPENAI_NO_KEY in line for line in logged)


def test_what_litellm_says_each_provider_needs() -> None:
    litellm = environment.litellm()
    anthropic = ModelEntry("claude", "anthropic/claude-sonnet-4-20250514")
    local = ModelEntry("local", "openai/served-model", api_base="http://127.0.0.1:8000/v1")
    keyed = ModelEntry("keyed", "openai/gpt-4o", api_key="sk-configured")

    with pytest.MonkeyPatch.context() as env:
        env.delenv("ANTHROPIC_API_KEY", raising=False)
        assert missing_keys(litellm, anthropic, "anthropic") == ("ANTHROPIC_API_KEY",)
        env.setenv("ANTHROPIC_API_KEY", "sk-ant")
        assert missing_keys(litellm, anthropic, "anthropic") == ()
    assert missing_keys(litellm, local, "openai") == ()
    assert missing_keys(litellm, keyed, "openai") == ()


# --- GET /v1/models/{id} --------------------------------------------------------------------------------------


def test_a_model_is_retrieved_by_its_id_in_openais_shape(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    models = [
        {"name": "fake", "model": "openai/fake-model", "api_base": fake.url},
        {"name": "Qwen/Qwen2.5-7B-Instruct", "model": "openai/Qwen/Qwen2.5-7B-Instruct", "api_base": fake.url},
    ]
    proxy = serve_proxy(models=models)
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0) as client:
        model = client.models.retrieve("fake")
        with_slash = client.models.retrieve("Qwen/Qwen2.5-7B-Instruct")
        listed = {m.id: m for m in client.models.list()}

    assert (model.id, model.object, model.owned_by) == ("fake", "model", "context-infinity")
    assert with_slash.id == "Qwen/Qwen2.5-7B-Instruct"
    assert model == listed["fake"]
    raw = httpx.get(f"{proxy.base_url}/models/fake").json()
    assert set(raw) == {"id", "object", "created", "owned_by"}


def test_an_unknown_model_id_is_openais_404(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy = serve_proxy()
    with (
        openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0) as client,
        pytest.raises(openai.NotFoundError) as caught,
    ):
        client.models.retrieve("gpt-9")

    assert (caught.value.code, caught.value.param) == ("model_not_found", "model")
    response = httpx.get(f"{proxy.base_url}/models/gpt-9")
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model `gpt-9` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_a_model_lookup_needs_a_proxy_key_when_keys_are_set(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy = serve_proxy(auth={"keys": ["k1"]})
    with openai.OpenAI(base_url=proxy.base_url, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.retrieve("fake")
        with pytest.raises(openai.AuthenticationError):
            bad.models.retrieve("gpt-9")  # no answer about which models exist without a key
    with openai.OpenAI(base_url=proxy.base_url, api_key="k1", max_retries=0) as good:
        assert good.models.retrieve("fake").id == "fake"
