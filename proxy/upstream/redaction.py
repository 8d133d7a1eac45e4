"""Secrets taken out of an upstream's own words before they reach a client, a log line or the journal.

Providers echo what they refused: a 401 may quote the `Authorization` header, part of the key, or a request
the proxy built with the operator's key in it. `Redactor` replaces every secret the configuration holds (each
model's `api_key`, the proxy's client keys), the provider keys that models without an `api_key` take from the
environment (`OPENAI_API_KEY` and the like: `proxy.upstream.credentials.redactor` builds it, reading them once)
and anything shaped like a key (`sk-…`, `Bearer …`, `x-api-key: …`, a long run of letters and digits) with
`[redacted]`. A token after `Bearer` or `api-key:`
must hold a digit, so a provider's own help text (`Authorization: Bearer YOUR_KEY`) reads unchanged. It is
built once from the frozen config and applied once, where a foreign exception becomes an `UpstreamError`
(`proxy.upstream.failures`).

What it returns is at most `MAX_TEXT_CHARS` long, marked where it was cut: an upstream's error can be any size
(a 200 MB body), and the patterns cost time in proportion to the text, on the event loop. Only the head of a
long text is searched, a little past the cut, so a secret that straddles the cut is never kept in part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

REDACTED = "[redacted]"
MAX_TEXT_CHARS = 64 * 1024
"""The most of an upstream's text the proxy keeps: what it relays, stores and logs of an error."""
CUT_MARK = " [… cut: the upstream's text was longer]"
CUT_MARGIN_CHARS = 256
"""Searched past the cut and then dropped: longer than any key shape's shortest match."""
MIN_SECRET_CHARS = 4
"""Configured secrets shorter than this are not searched for: they would blank ordinary words."""

KEY_SHAPES = re.compile(
    r"""
    # OpenAI/Anthropic-style keys, also as providers mask them (sk-abc****wxyz)
    \b(?:sk|pk|rk)-[A-Za-z0-9_\-*]{6,}
    # Authorization: Bearer <token>
    | (?<=\b[Bb]earer\ )\s*(?=[A-Za-z_\-.~+/=*]*[0-9])[A-Za-z0-9_\-.~+/=*]{6,}
    # x-api-key: <token>, "api_key": "<token>"
    | (?i:(?<=api[-_]key)|(?<=api[-_]key")|(?<=api[-_]key'))\s*[:=]\s*["']?(?=[^\s"',}0-9]*[0-9])[^\s"',}]{6,}
    # a long run of letters and digits, both present
    | \b(?=[A-Za-z_\-]*[0-9])(?=[0-9_\-]*[A-Za-z])[A-Za-z0-9_\-]{32,}\b
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Redactor:
    """Replaces configured secrets and key-shaped text; the empty one still removes key shapes."""

    secrets: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, secrets: Iterable[str]) -> Redactor:
        """For these secrets (a config's: `proxy.upstream.credentials.redactor`), longest first; those too short
        to search for left out."""
        usable = {secret for secret in secrets if len(secret) >= MIN_SECRET_CHARS}
        return cls(tuple(sorted(usable, key=len, reverse=True)))

    def redact(self, text: str, limit: int = MAX_TEXT_CHARS) -> str:
        """`text` without secrets, and at most `limit` characters long (cut and marked when it was longer)."""
        if len(text) <= limit:
            return self._redacted(text)
        # A secret cut at the end of the searched head would escape the patterns: search past the cut by more
        # than any secret's length, then drop that margin.
        margin = max(CUT_MARGIN_CHARS, max((len(secret) for secret in self.secrets), default=0))
        head = self._redacted(text[: limit + margin])
        keep = max(0, min(len(head) - margin, limit - len(CUT_MARK)))
        return head[:keep] + CUT_MARK

    def _redacted(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return KEY_SHAPES.sub(_shape_replacement, text)


def _shape_replacement(match: re.Match[str]) -> str:
    value = match.group(0)
    separator = re.match(r"\s*[:=]\s*[\"']?", value)
    if separator is not None and separator.group(0):
        return separator.group(0) + REDACTED
    return REDACTED


NO_SECRETS = Redactor()
