"""The proxy's configuration: one YAML (or JSON) file read once at startup into frozen dataclasses.

Every other module receives the pieces it needs from the one `Config` built here; nothing reads the file or
the environment later. A wrong file fails at startup with a `ConfigError` that names the key and the problem,
because a typo found on the first request (or never) is far more expensive than one found at `serve`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from proxy.config.models import ModelEntry, model_entries
from proxy.config.sections import ConfigError as ConfigError  # raised by `load_config`: callers catch it from here
from proxy.config.sections import Section, expand, file_key, read_fields, setting

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
DEFAULT_STORE_PATH = "context-infinity.db"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_MESSAGES = 20_000
DEFAULT_MAX_BODY_VALUES = 1_000_000
DEFAULT_MAX_MESSAGE_CHARS = 4 * 1024 * 1024
DEFAULT_MAX_ANSWER_CHARS = 4 * 1024 * 1024
DEFAULT_TIMEOUT_S = 600.0
"""Between reads of the upstream's response (LiteLLM's `timeout`): a stall, not a slow answer."""
DEFAULT_FIRST_BYTE_TIMEOUT_S = 300.0
"""From the upstream call to a stream's first chunk: long enough for a reasoning model that thinks in silence."""
DEFAULT_STREAM_DEADLINE_S = 1800.0
"""From the upstream call to a stream's end, however steadily it drips."""
DEFAULT_HEADER_TIMEOUT_S = 30.0
"""From a connection's (or a request's) first byte to the end of its headers."""
DEFAULT_BODY_TIMEOUT_S = 120.0
"""From the end of the headers to the end of the body: 32 MB at about 2 Mbit/s."""
DEFAULT_KEEP_ALIVE_S = 75.0
"""An idle connection's life; well above clients' own (httpx's 5 s), as nginx's 75 s is."""
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
"""A request line and headers together; real clients send a few KiB (nginx's default limit is 32 KiB)."""
DEFAULT_KEEP_EVENTS_S = 24 * 3600
DEFAULT_MAX_SUMMARIZER_CALLS = 2
"""Summarizer-model calls one request may wait for; further summaries it needs are extractive."""
DEFAULT_SUMMARIZER_DEADLINE_S = 60.0
"""Wall time one request may spend waiting on the summarizer model."""
DEFAULT_SUMMARIZER_FAILURES = 3
DEFAULT_SUMMARIZER_COOLDOWN_S = 60.0
"""The summarizer's circuit breaker (`proxy.compaction.breaker`): failures in a row, then seconds skipped."""
SYNCHRONOUS_MODES = ("NORMAL", "FULL")
TOOL_RESULTS = "tool-results"
SUMMARIZE = "summarize"
GOAL_BATCH = "goal-batch"
SLIDING_WINDOW = "sliding-window"
STRATEGY_NAMES = (TOOL_RESULTS, SUMMARIZE, GOAL_BATCH, SLIDING_WINDOW)
"""The compaction strategies (`proxy.compaction.strategies`), for `context.strategies` and X-Context-Strategy."""
DEFAULT_STRATEGIES = (TOOL_RESULTS, SUMMARIZE)
"""Old tool outputs become stubs first (no model call, most of an agent's context), then summaries."""
DEFAULT_HEADROOM_TURNS = 8
"""A crossing makes room for about this many turns' growth, and no more: the context stays near its budget (a
sliding window of the same budget never keeps more originals), and a prompt cache still hits on all but one
request in this many. Large turns (an agent's tool outputs) reach `compact_to` first, which bounds the step."""
DEFAULT_SUMMARY_SHARE = 0.3
"""The share of the free space the summaries of the compacted past may take at most: they grow with what they
stand for (`target_ratio` of it) up to this, then older summaries are merged rather than newer originals
summarized, so the originals a sliding window would keep are not traded for ever more summaries."""
DEFAULT_TOOL_RESULTS_KEEP_TURNS = 1
"""All but the newest tool outputs are stubbed at a crossing: an agent reads what it just ran, and stubbing the
rest at once moves the next crossing furthest away and changes the prompt least after the change."""
DEFAULT_PRECOMPACT_RATIO = 0.8
DEFAULT_PRECOMPACT_CONCURRENCY = 2
DEFAULT_RECALL_TOKENS = 1024
DEFAULT_CORRECTION_TTL_S = 6 * 3600.0
LOG_FORMATS = ("TEXT", "JSON")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_MIN_BODY_RATE = 500.0
"""Bytes a second below which a request body's connection may be closed to make room (Apache's MinRate)."""
DEFAULT_WRITE_TIMEOUT_S = 30.0
"""How long a response may wait for its client to take bytes (a full socket) before the client is dropped."""
DEFAULT_SOCKET_IDLE_TIMEOUT_S = 300.0
"""How long a WebSocket may wait for its client's next request: a coding agent's socket outlives a turn's
thinking, and one closed is reopened by the client (Codex resends the whole input on the new one)."""
DEFAULT_MAX_SOCKETS_PER_KEY = 64
"""WebSockets one key may hold open: an agent keeps one per conversation, so 64 agents at once on one key."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = setting(DEFAULT_PORT, minimum=0, maximum=65535)
    header_timeout_s: float = setting(DEFAULT_HEADER_TIMEOUT_S, low=0.001, high=3600.0)
    body_timeout_s: float = setting(DEFAULT_BODY_TIMEOUT_S, low=0.001, high=86400.0)
    write_timeout_s: float = setting(DEFAULT_WRITE_TIMEOUT_S, low=0.001, high=86400.0)
    """How long a client may leave a response unread (its socket full) before it is dropped; a stream's answer is
    still journaled to its end (`journal.finish_on_disconnect`)."""
    keep_alive_s: float = setting(DEFAULT_KEEP_ALIVE_S, low=0.001, high=86400.0)
    max_header_bytes: int = setting(DEFAULT_MAX_HEADER_BYTES, minimum=1024, maximum=16 * 1024 * 1024)
    """A request's line and headers together; past it the request is answered 431 before it is parsed further."""
    max_connections: int | None = setting(None, minimum=1)
    """Open client connections; a new one beyond closes the one waiting longest for a request, else the slowest
    body (below `min_body_rate`), else is served only as a health check. None: half of what the open-file limit
    leaves (`proxy.serving.server.default_max_connections`)."""
    min_body_rate: float = setting(DEFAULT_MIN_BODY_RATE, low=0.0, high=1e12)
    """Bytes a second: a request body arriving slower (after a second) makes its connection evictable when
    `max_connections` is reached."""
    socket_idle_timeout_s: float = setting(DEFAULT_SOCKET_IDLE_TIMEOUT_S, low=0.001, high=86400.0)
    """How long a WebSocket may wait for its client's next `response.create` before it is closed (1001, going
    away); while it waits it is evictable as an idle keep-alive connection is."""
    max_sockets_per_key: int = setting(DEFAULT_MAX_SOCKETS_PER_KEY, minimum=1, maximum=1_000_000)
    """WebSockets one key may hold open (without `auth.keys`, all clients together); a handshake past it is
    refused 429 `too_many_sockets`."""


_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")


def redacted_url(url: str) -> str:
    """A database URL with its password replaced, for logs and errors."""
    return _URL_PASSWORD.sub(r"\1***@", url)


@dataclass(frozen=True)
class StoreConfig:
    path: Path = Path(DEFAULT_STORE_PATH)
    url: str | None = setting(None, repr=False)
    """`postgresql://…`: the shared store of several replicas instead of the SQLite file (it may hold a
    password, so it is never shown: `location` is)."""
    pool_size: int = setting(10, minimum=1, maximum=1000)
    """PostgreSQL connections per process for reads, and as many for the locks held across replicas."""
    retention_days: int | None = setting(None, minimum=1, maximum=1_000_000)
    """Sessions idle longer than this many days are deleted, with everything they stored, by a background sweep
    (`proxy.lifecycle.retention`); None keeps every session for ever."""
    tenant_retention_days: tuple[tuple[str, int | None], ...] = ()
    """Per tenant (its id, `key-…`, as `context-proxy tenants list` shows it): days that replace `retention_days`
    for its sessions (None: its sessions are kept for ever)."""

    def retention_of(self, tenant: str) -> int | None:
        """The days a tenant's idle sessions are kept."""
        return dict(self.tenant_retention_days).get(tenant, self.retention_days)

    @property
    def target(self) -> Path | str:
        """What `Database.open` opens: the URL if there is one, else the file."""
        return self.url or self.path

    @property
    def location(self) -> str:
        """The store as logs and errors may name it: the file, or the URL without its password."""
        return str(self.path) if self.url is None else redacted_url(self.url)


@dataclass(frozen=True)
class ContextConfig:
    preserve_recent: int = setting(4, minimum=0)
    target_ratio: float = setting(0.15, low=0.0, high=1.0)
    safety_margin: float = setting(0.05, low=0.0, high=0.5)
    trigger_ratio: float = setting(1.0, low=0.1, high=1.0)
    compact_to: float = setting(0.55, low=0.05, high=1.0)
    headroom_turns: int = setting(DEFAULT_HEADROOM_TURNS, minimum=0, maximum=1000)
    """A crossing compacts to the budget less this many turns' growth, never below `compact_to`; 0: always
    down to `compact_to`."""
    summary_share: float = setting(DEFAULT_SUMMARY_SHARE, low=0.0, high=1.0)
    """The share of the free space the summaries of the compacted past may take at most."""
    summarizer_model: str | None = None
    max_summarizer_calls: int = setting(DEFAULT_MAX_SUMMARIZER_CALLS, minimum=0)
    summarizer_deadline_s: float = setting(DEFAULT_SUMMARIZER_DEADLINE_S, low=0.0, high=86400.0)
    summarizer_failures: int = setting(DEFAULT_SUMMARIZER_FAILURES, minimum=1, maximum=1000)
    """Failed summarizer calls in a row after which the summarizer is skipped for `summarizer_cooldown_s`."""
    summarizer_cooldown_s: float = setting(DEFAULT_SUMMARIZER_COOLDOWN_S, low=0.0, high=86400.0)
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    """The compaction strategies, in the order they run; a session may choose others (X-Context-Strategy)."""
    tool_results_keep_turns: int = setting(DEFAULT_TOOL_RESULTS_KEEP_TURNS, minimum=1, maximum=1000)
    """`tool-results` stubs tool outputs older than this many user turns."""
    precompact_ratio: float | None = DEFAULT_PRECOMPACT_RATIO
    """Past this share of the budget, the next compaction's summaries are written in the background; None: off."""
    precompact_concurrency: int = setting(DEFAULT_PRECOMPACT_CONCURRENCY, minimum=1, maximum=64)
    """Background compactions running at once, over all sessions."""
    pin_patterns: tuple[re.Pattern[str], ...] = ()
    """A message whose text matches one of these is pinned, as if by `POST /sessions/{id}/pins`."""
    recall_tokens: int = setting(DEFAULT_RECALL_TOKENS, minimum=0)
    """Tokens of archived originals (hits and the turns around them) recalled into the working context when the
    latest user message asks about what only they hold; 0: no recall."""
    recall_fill: bool = True
    """What room `recall_tokens` and the budget leave a turn is filled too, for that turn only: hidden turns that
    share a word with the latest user message, then the latest hidden turns (what a sliding window still shows); a
    compacted chat then keeps that room below its budget (`compaction.layout.Policy.reserve`), and a request that
    declares no tools, on a path that calls none, is filled up to its budget (`compaction.recall_room`)."""
    correction_ttl_s: float = setting(DEFAULT_CORRECTION_TTL_S, low=60.0, high=30 * 86400.0)
    """How long a correction learned from an upstream's context-window refusal holds before the upstream has to
    confirm it by refusing again (`proxy.budget.corrections`)."""
    client_compaction: bool = True
    """Answer a client's own compaction request (Claude Code's /compact, Codex's local compaction) from what the
    proxy holds, with no model call, and expand its summary back to the whole conversation later; false: such a
    request goes to the model like any other (`proxy.request.client_compaction`)."""


@dataclass(frozen=True)
class JournalConfig:
    synchronous: str = setting("NORMAL", choices=SYNCHRONOUS_MODES)
    finish_on_disconnect: bool = True
    keep_events_s: float | None = setting(DEFAULT_KEEP_EVENTS_S, key="keep_events")
    """How long a sealed step keeps its events; None keeps them forever, 0 prunes on seal."""


@dataclass(frozen=True)
class RequestLimits:
    """The `limits:` section: how much one request may send (not a model's limits: see `proxy.budget`)."""

    max_body_bytes: int = setting(DEFAULT_MAX_BODY_BYTES, minimum=1024)
    max_messages: int = setting(DEFAULT_MAX_MESSAGES, minimum=1)
    """Messages (or input items) in one request: far above a real agent's conversation, far below what keeps
    one request's parsing, hashing and storing short."""
    max_message_chars: int = setting(DEFAULT_MAX_MESSAGE_CHARS, minimum=1024)
    """Characters of text in one message (its strings, keys included); a larger one is a 413."""
    max_answer_chars: int = setting(DEFAULT_MAX_ANSWER_CHARS, minimum=1024)
    """Characters of text and tool call arguments in one upstream answer; past it the answer is cut off with an
    `answer_too_large` error (what came is kept in the journal step)."""
    max_body_values: int = setting(DEFAULT_MAX_BODY_VALUES, minimum=1024)
    """JSON values in one body (strings, numbers, booleans, nulls, arrays and objects, at any depth): ~10 a message
    of a real agent's conversation, so 20,000 messages and their tools hold ~250,000. A body of more is refused
    with a 400 as soon as its scan passes the limit (`proxy.doors.json_values`)."""


@dataclass(frozen=True)
class UpstreamConfig:
    timeout_s: float = setting(DEFAULT_TIMEOUT_S, low=0.001, high=86400.0)
    num_retries: int = setting(0, minimum=0, maximum=10)
    first_byte_timeout_s: float = setting(DEFAULT_FIRST_BYTE_TIMEOUT_S, low=0.001, high=86400.0)
    stream_deadline_s: float = setting(DEFAULT_STREAM_DEADLINE_S, low=0.001, high=86400.0)


@dataclass(frozen=True)
class AuthConfig:
    keys: tuple[str, ...] = setting((), repr=False)
    admin_keys: tuple[str, ...] = setting((), repr=False)
    """Keys of the operator's routes (`/admin/...`); none: those routes answer 403. Not tenants' keys."""

    @property
    def enabled(self) -> bool:
        return bool(self.keys)


@dataclass(frozen=True)
class ObservabilityConfig:
    metrics: bool = setting(True, section="metrics", key="enabled")
    """Serve `GET /metrics`."""
    metrics_require_key: bool = setting(True, section="metrics", key="require_key")
    """With `auth.keys` set, a scrape needs a proxy key like every other route; false lets any scraper in."""
    ui: bool = setting(True, section="ui", key="enabled")
    """Serve the dashboard at `/ui`."""
    log_format: str = setting("text", section="logging", key="format", choices=LOG_FORMATS)
    """`text`: one line per record; `json`: one JSON object per line, with the same fields."""
    log_level: str = setting("INFO", section="logging", key="level", choices=LOG_LEVELS)


@dataclass(frozen=True)
class Config:
    server: ServerConfig = ServerConfig()
    store: StoreConfig = StoreConfig()
    models: tuple[ModelEntry, ...] = ()
    context: ContextConfig = ContextConfig()
    journal: JournalConfig = JournalConfig()
    request_limits: RequestLimits = field(default=RequestLimits(), metadata={"key": "limits"})
    upstream: UpstreamConfig = UpstreamConfig()
    auth: AuthConfig = AuthConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    def model(self, name: str) -> ModelEntry | None:
        for entry in self.models:
            if entry.name == name:
                return entry
        return None


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read, expand and validate a config file; relative store paths are taken from the file's folder."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {file} is not UTF-8 text") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {file} is not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    return parse_config(raw, base_dir=file.resolve().parent, environ=os.environ if environ is None else environ)


def parse_config(raw: Any, base_dir: Path, environ: Mapping[str, str]) -> Config:
    root = Section(expand(raw, environ), "")
    observability = sorted({str(f.metadata["section"]) for f in fields(ObservabilityConfig)})
    root.reject_unknown({file_key(f) for f in fields(Config) if f.name != "observability"} | set(observability))
    store = root.section("store")
    store_path = Path(store.string("path", DEFAULT_STORE_PATH))
    if not store_path.is_absolute():
        store_path = base_dir / store_path
    store_url = store.optional_string("url")
    if store_url is not None:
        if store.optional_string("path") is not None:
            raise ConfigError("store: give either path (SQLite) or url (PostgreSQL), not both")
        if not store_url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(f"store.url: must be a postgresql:// URL, got {redacted_url(store_url)!r}")

    context_section = root.section("context")
    context = read_fields(
        ContextConfig,
        context_section,
        strategies=_strategies(context_section),
        pin_patterns=_patterns(context_section, "pin_patterns"),
        precompact_ratio=None,
    )
    context = replace(context, precompact_ratio=_precompact_ratio(context_section, context.trigger_ratio))
    config = Config(
        server=read_fields(ServerConfig, root.section("server")),
        store=read_fields(
            StoreConfig, store, path=store_path, url=store_url, tenant_retention_days=_tenant_retention(store)
        ),
        models=model_entries(root),
        context=context,
        journal=read_fields(JournalConfig, root.section("journal")),
        request_limits=read_fields(RequestLimits, root.section("limits")),
        upstream=read_fields(UpstreamConfig, root.section("upstream")),
        auth=read_fields(AuthConfig, root.section("auth")),
        observability=read_fields(ObservabilityConfig, {name: root.section(name) for name in observability}),
    )
    if config.context.compact_to > config.context.trigger_ratio:
        raise ConfigError("context.compact_to must not be greater than context.trigger_ratio")
    precompact = config.context.precompact_ratio
    if precompact is not None and precompact > config.context.trigger_ratio:
        raise ConfigError("context.precompact_ratio must not be greater than context.trigger_ratio")
    if set(config.auth.admin_keys) & set(config.auth.keys):
        raise ConfigError("auth.admin_keys: an admin key must not also be a client key in auth.keys")
    summarizer = config.context.summarizer_model
    if summarizer is not None and config.model(summarizer) is None:
        raise ConfigError(f"context.summarizer_model: {summarizer!r} is not the name of an entry in models")
    return config


def parse_strategies(text: str) -> tuple[str, ...] | None:
    """`tool-results, summarize` → the names in order; None when one is unknown, repeated, or none is given."""
    names = tuple(name.strip().lower() for name in text.split(","))
    if not names or any(name not in STRATEGY_NAMES for name in names) or len(set(names)) != len(names):
        return None
    return names


def _strategies(context: Section) -> tuple[str, ...]:
    raw = context.data.get("strategies")
    if raw is None:
        return DEFAULT_STRATEGIES
    if isinstance(raw, list) and all(isinstance(name, str) for name in raw):
        raw = ",".join(raw)
    names = parse_strategies(raw) if isinstance(raw, str) else None
    if names is None:
        raise ConfigError(
            f"{context.key('strategies')}: must be a list of distinct strategies from {', '.join(STRATEGY_NAMES)}"
        )
    return names


def _precompact_ratio(context: Section, trigger_ratio: float) -> float | None:
    """Unset: `DEFAULT_PRECOMPACT_RATIO` of the trigger (0.8 of the budget with the default trigger)."""
    if "precompact_ratio" not in context.data:
        return round(DEFAULT_PRECOMPACT_RATIO * trigger_ratio, 6)
    raw = context.data["precompact_ratio"]
    if raw is None or raw is False or (isinstance(raw, str) and raw.strip().lower() == "off"):
        return None
    return context.number("precompact_ratio", DEFAULT_PRECOMPACT_RATIO, low=0.05, high=1.0)


def _tenant_retention(store: Section) -> tuple[tuple[str, int | None], ...]:
    """`store.tenant_retention_days`: a mapping of tenant ids to days (or null: kept for ever)."""
    raw = store.data.get("tenant_retention_days") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{store.key('tenant_retention_days')}: must map tenant ids (key-…) to days")
    days = Section(raw, store.key("tenant_retention_days"))
    return tuple((str(tenant), days.optional_integer(str(tenant), 1, 1_000_000)) for tenant in raw)


def _patterns(context: Section, name: str) -> tuple[re.Pattern[str], ...]:
    compiled = []
    for index, pattern in enumerate(context.string_list(name)):
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            raise ConfigError(f"{context.key(name)}[{index}]: not a regular expression ({exc})") from exc
    return tuple(compiled)
