"""The proxy's Prometheus metrics: one registry per served app, recorded where the work happens.

Each app (and each test's proxy) owns its `Metrics` and registry, never prometheus_client's global one, so
several proxies in one process count separately. Labels come from bounded sets only: route templates, the
configured model names (anything else is `other`), strategy names, outcomes and statuses; never a session id,
a tenant or a client's text, so a scrape stays small whatever the traffic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from proxy.config.schema import STRATEGY_NAMES
from proxy.cost import TokenCost

CONTENT_TYPE = CONTENT_TYPE_LATEST
OTHER = "other"
"""The label of a model, strategy or route outside the bounded set."""
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: a few milliseconds of the proxy's own work up to a long reasoning model's answer."""
OUTCOMES = ("llm", "fallback", "rule", "error")
"""A compaction's outcome: written by the summarizer model, by the extractive fallback, by a rule (stubs and
markers need no model), or failed."""


class Metrics:
    def __init__(self, models: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._models = frozenset(models)
        registry = self.registry
        self.requests = Counter(
            "context_proxy_requests",
            "Requests answered (over HTTP, and each one on a WebSocket), by route template, model and status code.",
            ["route", "model", "status"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "context_proxy_request_duration_seconds",
            "From the request's arrival to the end of its response (a stream's last byte), by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.first_byte_seconds = Histogram(
            "context_proxy_stream_first_byte_seconds",
            "Streams: from the request's arrival to the first byte of the response (on a WebSocket, its first event).",
            ["route", "model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream_seconds = Histogram(
            "context_proxy_upstream_seconds",
            "One upstream call: until its whole answer (stream=false) or until its stream opened (stream=true).",
            ["model", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.added_seconds = Histogram(
            "context_proxy_added_seconds",
            "The proxy's own work before a request's upstream call: storing the history, compaction, recall.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.context_tokens = Counter(
            "context_proxy_context_tokens",
            "Prompt tokens sent upstream, by the proxy's own count of each working context.",
            ["model"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "context_proxy_prompt_tokens",
            "Prompt tokens as the upstream reported them in its answers' usage.",
            ["model"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "context_proxy_completion_tokens",
            "Completion tokens as the upstream reported them in its answers' usage.",
            ["model"],
            registry=registry,
        )
        self.cached_tokens = Counter(
            "context_proxy_cached_input_tokens",
            "Prompt tokens the upstream reported read from its prompt cache (OpenAI's cached_tokens, Anthropic's"
            " cache_read_input_tokens); a share of context_proxy_prompt_tokens.",
            ["model"],
            registry=registry,
        )
        self.cache_creation_tokens = Counter(
            "context_proxy_cache_creation_tokens",
            "Prompt tokens the upstream reported written to its prompt cache (Anthropic's"
            " cache_creation_input_tokens); a share of context_proxy_prompt_tokens.",
            ["model"],
            registry=registry,
        )
        self.summarizer_tokens = Counter(
            "context_proxy_summarizer_tokens",
            "Tokens of the proxy's own summarizer calls as the summarizer reported them, by kind (prompt, cached,"
            " completion).",
            ["model", "kind"],
            registry=registry,
        )
        self.saved_tokens = Counter(
            "context_proxy_compaction_saved_tokens",
            "History tokens not sent upstream because compaction replaced them (history minus working context).",
            ["model"],
            registry=registry,
        )
        self.compactions = Counter(
            "context_proxy_compactions",
            "Compaction spans written (or failed), by strategy and outcome (llm, fallback, rule, error).",
            ["strategy", "outcome"],
            registry=registry,
        )
        self.client_compactions = Counter(
            "context_proxy_client_compactions",
            "A client's own compaction requests the proxy answered with no model call: `item` (Responses'"
            " compaction item) or `summary` (a summary request: `proxy.compaction.client_prompts`).",
            ["kind"],
            registry=registry,
        )
        self.summarizer_seconds = Histogram(
            "context_proxy_summarizer_seconds",
            "One summarizer model call, by outcome (ok, or error: the fallback was used).",
            ["outcome"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.journal_events = Counter(
            "context_proxy_journal_events",
            "Events written to the stream journal (chunks, and each step's closing event).",
            registry=registry,
        )
        self.journal_steps = Counter(
            "context_proxy_journal_steps",
            "Journal steps ended by this process, by status (sealed, failed, interrupted, complete).",
            ["status"],
            registry=registry,
        )
        self.recoveries = Counter(
            "context_proxy_journal_recovered_steps",
            "Open steps of gone processes settled by recovery, by outcome (complete, failed, interrupted).",
            ["outcome"],
            registry=registry,
        )
        self.active_streams = Gauge(
            "context_proxy_active_streams",
            "Upstream streams being relayed and journaled now (a stream whose client left included).",
            registry=registry,
        )
        self.sessions = Gauge(
            "context_proxy_sessions",
            "Sessions in the store, every tenant's (read at each scrape).",
            registry=registry,
        )
        self.store_bytes = Gauge(
            "context_proxy_store_bytes",
            "The store's size on disk (SQLite: the file and its write-ahead log; PostgreSQL: its tables).",
            registry=registry,
        )
        self.store_free_bytes = Gauge(
            "context_proxy_store_free_bytes",
            "SQLite: space free inside the file, reused by later writes (PostgreSQL: 0).",
            registry=registry,
        )
        self.store_rows = Gauge(
            "context_proxy_store_rows",
            "Rows per table of the store (PostgreSQL: the planner's estimates); read at most once a minute.",
            ["table"],
            registry=registry,
        )

    def model(self, name: str | None) -> str:
        return name if name in self._models else OTHER

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def usage(self, model: str | None, usage: Mapping[str, Any] | None) -> None:
        """An answer's usage as the upstream reported it, in any of its shapes (`proxy.cost`)."""
        cost = TokenCost.from_usage(usage)
        label = self.model(model)
        for counter, value in (
            (self.prompt_tokens, cost.sent),
            (self.completion_tokens, cost.completion),
            (self.cached_tokens, cost.cached),
            (self.cache_creation_tokens, cost.cache_creation),
        ):
            if value:
                counter.labels(label).inc(value)

    def summarizer_usage(self, model: str | None, cost: TokenCost) -> None:
        label = self.model(model)
        for kind, value in (("prompt", cost.sent), ("cached", cost.cached), ("completion", cost.completion)):
            if value:
                self.summarizer_tokens.labels(label, kind).inc(value)

    def compaction(self, strategy: str, outcome: str) -> None:
        self.compactions.labels(
            strategy if strategy in STRATEGY_NAMES else OTHER, outcome if outcome in OUTCOMES else OTHER
        ).inc()
