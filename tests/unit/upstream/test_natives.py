"""`proxy.upstream.natives`: each native client declares its API and key variables once, and that one list is
what the config's names, the router and the credentials check agree on."""

from __future__ import annotations

import pytest

from proxy.config.models import CHAT_API, UPSTREAM_APIS, ModelEntry
from proxy.config.schema import Config, UpstreamConfig
from proxy.upstream import credentials
from proxy.upstream.natives import NATIVE_CLIENTS, native_client
from proxy.upstream.redaction import REDACTED
from proxy.upstream.router import UpstreamRouter


def test_every_native_api_config_accepts_has_exactly_one_client() -> None:
    apis = [client.api for client in NATIVE_CLIENTS]
    assert sorted(apis) == sorted(api for api in UPSTREAM_APIS if api != CHAT_API)
    assert native_client(CHAT_API) is None
    assert all(native_client(api) is client for api, client in zip(apis, NATIVE_CLIENTS, strict=True))


def test_the_router_has_one_client_of_each_native_api() -> None:
    router = UpstreamRouter(UpstreamConfig(), ())
    assert {api: type(client) for api, client in router._natives.items()} == {
        client.api: client for client in NATIVE_CLIENTS
    }


@pytest.mark.parametrize("client", NATIVE_CLIENTS, ids=lambda client: client.api)
def test_a_keyless_native_model_reads_its_clients_variables(client: type, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = ModelEntry(name="native", model="hosted_vllm/x", api_base="http://127.0.0.1:9/v1", api=client.api)
    assert credentials.key_variables(entry, None) == client.key_variables
    for name in client.key_variables:
        monkeypatch.delenv(name, raising=False)
    variable = client.key_variables[-1]
    monkeypatch.setenv(variable, f"{client.api}-env-key-1")
    reader = client(UpstreamConfig())
    assert reader.key(entry) == f"{client.api}-env-key-1"
    assert reader.key(ModelEntry(name="own", model="x", api_key="own-key-2", api=client.api)) == "own-key-2"
    redactor = credentials.redactor(Config(models=(entry,)), environ={variable: f"{client.api}-env-key-1"})
    assert redactor.redact(f"echoed {client.api}-env-key-1") == f"echoed {REDACTED}"
