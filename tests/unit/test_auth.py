"""Who is calling (`proxy.auth`): the open tenant without keys, an opaque tenant id per configured key, and a
401 `invalid_api_key` that never echoes what the caller sent."""

from __future__ import annotations

import re

import pytest

from proxy.auth import OPEN_TENANT, Caller, authenticate, tenant_of
from proxy.config.schema import AuthConfig
from proxy.errors import AuthenticationFailed, openai_error

KEY_A = "sk-proxy-alpha-0123456789"
KEY_B = "sk-proxy-bravo-9876543210"
AUTH = AuthConfig(keys=(KEY_A, KEY_B))


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def rejected(headers: dict[str, str], auth: AuthConfig = AUTH, *, supplied: str | None = None) -> AuthenticationFailed:
    with pytest.raises(AuthenticationFailed) as caught:
        authenticate(headers, auth)
    error = caught.value
    status, body, _headers = openai_error(error)
    assert status == 401
    assert body["error"]["code"] == "invalid_api_key"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"]
    if supplied:
        assert supplied not in body["error"]["message"]
        assert supplied not in str(error)
        assert supplied not in repr(error.args)
    return error


# --- no keys configured --------------------------------------------------------------------------------------


def test_no_keys_is_the_open_tenant() -> None:
    assert not AuthConfig().enabled
    assert authenticate({}, AuthConfig()) == Caller(OPEN_TENANT)


def test_no_keys_ignores_any_authorization_header() -> None:
    for headers in (bearer("whatever"), {"authorization": "Basic abc"}, {"authorization": ""}):
        assert authenticate(headers, AuthConfig()).tenant == OPEN_TENANT


# --- a configured key ----------------------------------------------------------------------------------------


def test_configured_key_is_a_hashed_tenant() -> None:
    assert AUTH.enabled
    caller = authenticate(bearer(KEY_A), AUTH)
    assert caller.tenant != OPEN_TENANT
    assert caller.tenant == tenant_of(KEY_A)
    assert re.fullmatch(r"key-[0-9a-f]{24}", caller.tenant)
    assert KEY_A not in caller.tenant
    assert "alpha" not in caller.tenant


def test_second_configured_key_is_accepted() -> None:
    assert authenticate(bearer(KEY_B), AUTH).tenant == tenant_of(KEY_B)


def test_two_keys_are_two_tenants() -> None:
    assert authenticate(bearer(KEY_A), AUTH).tenant != authenticate(bearer(KEY_B), AUTH).tenant


def test_same_key_is_the_same_tenant() -> None:
    first = authenticate(bearer(KEY_A), AUTH)
    second = authenticate(bearer(KEY_A), AuthConfig(keys=(KEY_A,)))
    assert first == second


def test_tenant_does_not_depend_on_the_order_of_keys() -> None:
    reordered = AuthConfig(keys=(KEY_B, KEY_A))
    assert authenticate(bearer(KEY_A), reordered) == authenticate(bearer(KEY_A), AUTH)


def test_scheme_is_case_insensitive_and_key_is_trimmed() -> None:
    expected = tenant_of(KEY_A)
    assert authenticate({"authorization": f"bearer {KEY_A}"}, AUTH).tenant == expected
    assert authenticate({"authorization": f"BEARER   {KEY_A}  "}, AUTH).tenant == expected


def test_keys_are_not_shown_in_the_config_repr() -> None:
    assert KEY_A not in repr(AUTH)


# --- rejected ------------------------------------------------------------------------------------------------


def test_wrong_key_is_rejected_without_echo() -> None:
    wrong = "sk-proxy-wrong-key-55555"
    rejected(bearer(wrong), supplied=wrong)


def test_prefix_of_a_key_is_rejected() -> None:
    rejected(bearer(KEY_A[:-1]), supplied=KEY_A[:-1])


def test_key_with_extra_characters_is_rejected() -> None:
    rejected(bearer(KEY_A + "x"), supplied=KEY_A + "x")


def test_missing_header_is_rejected() -> None:
    rejected({})


def test_wrong_scheme_is_rejected() -> None:
    rejected({"authorization": f"Basic {KEY_A}"}, supplied=KEY_A)
    rejected({"authorization": f"Token {KEY_A}"}, supplied=KEY_A)


def test_key_without_scheme_is_rejected() -> None:
    rejected({"authorization": KEY_A}, supplied=KEY_A)


def test_empty_key_is_rejected() -> None:
    rejected({"authorization": "Bearer"})
    rejected({"authorization": "Bearer "})
    rejected({"authorization": "Bearer    "})
    rejected({"authorization": ""})


def test_a_key_is_not_accepted_for_another_config() -> None:
    rejected(bearer(KEY_B), AuthConfig(keys=(KEY_A,)), supplied=KEY_B)


def test_non_ascii_key_is_rejected_not_crashing() -> None:
    rejected(bearer("sk-é-ключ"), supplied="sk-é-ключ")
