"""proxy.upstream.redaction: configured secrets and key-shaped text leave the upstream's words."""

from __future__ import annotations

import pytest

from proxy.config.models import ModelEntry
from proxy.config.schema import AuthConfig, Config
from proxy.upstream import credentials
from proxy.upstream.failures import upstream_error
from proxy.upstream.redaction import CUT_MARK, MAX_TEXT_CHARS, REDACTED, Redactor

CONFIG = Config(
    models=(ModelEntry(name="m", model="openai/x", api_key="upstream-key-1234"),),
    auth=AuthConfig(keys=("client-key-99", "abc")),
)


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ("refused upstream-key-1234 and client-key-99", ("upstream-key-1234", "client-key-99")),
        ("Incorrect API key provided: sk-upstr**********1234.", ("sk-upstr",)),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload", ("eyJhbGciOiJIUzI1NiJ9",)),
        ('{"x-api-key": "zz-0123456789"}', ("zz-0123456789",)),
        ("token a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8 seen", ("a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",)),
    ],
)
def test_secrets_and_key_shapes_are_redacted(text: str, gone: tuple[str, ...]) -> None:
    redacted = credentials.redactor(CONFIG).redact(text)
    assert REDACTED in redacted
    for secret in gone:
        assert secret not in redacted


def test_ordinary_error_text_is_kept() -> None:
    text = "This model's maximum context length is 8192 tokens (gpt-4o-mini, chatcmpl-123); a b c."
    assert credentials.redactor(CONFIG).redact(text) == text


def test_the_boundary_redacts_message_and_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    error = upstream_error(
        RuntimeError('Exception - {"error": {"message": "bad key upstream-key-1234", "type": "auth"}}'),
        redactor=credentials.redactor(CONFIG),
    )
    assert error.message == f"bad key {REDACTED}"
    assert "upstream-key-1234" not in caplog.text


def test_placeholders_in_provider_help_text_are_kept() -> None:
    text = "Use an Authorization header with Bearer auth (i.e. Authorization: Bearer YOUR_KEY), api_key: YOUR_KEY."
    assert Redactor().redact(text) == text


def test_provider_keys_read_from_the_environment_are_redacted() -> None:
    models = (
        ModelEntry(name="own", model="openai/x", api_base="http://127.0.0.1:9/v1"),
        ModelEntry(name="claude", model="anthropic/claude-sonnet-4-20250514"),
        ModelEntry(name="groq", model="groq/llama-3.1-8b-instant"),
        ModelEntry(name="native", model="gpt-4o", api="responses"),
    )
    environ = {
        "OPENAI_API_KEY": "openai-env-1",
        "ANTHROPIC_AUTH_TOKEN": "anthropic-env-2",
        "GROQ_API_KEY": "groq-env-3",
        "MISTRAL_API_KEY": "mistral-env-4",
    }
    redactor = credentials.redactor(Config(models=models), environ=environ)
    text = "echoed openai-env-1, anthropic-env-2 and groq-env-3; mistral-env-4 is no model's"
    assert redactor.redact(text) == f"echoed {REDACTED}, {REDACTED} and {REDACTED}; mistral-env-4 is no model's"


def test_an_entry_with_its_own_key_reads_none_from_the_environment() -> None:
    redactor = credentials.redactor(CONFIG, environ={"OPENAI_API_KEY": "openai-env-1"})
    assert redactor.redact("openai-env-1") == "openai-env-1"


@pytest.mark.parametrize("offset", [-30, -12, -5, -1, 0, 3, 100])
def test_a_long_text_is_cut_and_a_secret_at_the_cut_is_never_kept_in_part(offset: int) -> None:
    secret = "hunter2-configured-password"
    text = "word " * (MAX_TEXT_CHARS // 5) + "x" * 40
    position = MAX_TEXT_CHARS - len(CUT_MARK) + offset
    text = text[:position] + secret + text[position:] + "tail " * 200_000
    redacted = Redactor((secret,)).redact(text)
    assert len(redacted) <= MAX_TEXT_CHARS
    assert redacted.endswith(CUT_MARK)
    assert "hunt" not in redacted, "no part of the secret is kept"
