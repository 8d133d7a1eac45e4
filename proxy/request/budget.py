"""One request's reckoning before any write: its model, the output it may reserve, what its definitions (tools,
output schema) cost, and the budget all that leaves its messages; and `count_tokens`, the same reckoning for a
conversation that is only counted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.budget.budgets import Budget, Budgets
from proxy.canonical.conversation import Conversation
from proxy.canonical.vocabulary import SYSTEM_ROLES
from proxy.compaction.compactor import Compactor
from proxy.config.models import ModelEntry
from proxy.config.schema import Config
from proxy.errors import ContextTooLarge, NotFound
from proxy.offload import compute
from proxy.tokens import (
    TOKENS_PER_MESSAGE,
    count_definitions,
    count_message,
    count_prompt,
    encoding_for_model,
    rough_size,
)

TOOL_CHARS = 2_000
"""About what one tool definition of an agent's holds: how the work of counting them is sized (`offload`)."""


def model_entry(config: Config, model: str) -> ModelEntry:
    entry = config.model(model)
    if entry is None:
        raise NotFound(
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
            code="model_not_found",
        )
    return entry


async def fit_output(budgets: Budgets, entry: ModelEntry, conversation: Conversation) -> Conversation:
    """The output request within what the configured model can give, when the client asked for its own model's
    (`Conversation.fit_output`), beside what the request sends every time: its definitions (counted:
    `counted`) and its system messages, counted only when they could lower it (`Budgets.fitted_output`)."""
    requested = conversation.max_output
    if not conversation.fit_output or requested is None:
        return conversation
    fixed = conversation.definitions
    fitted = budgets.fitted_output(entry, requested, fixed)
    system = [message for message in conversation.messages if message.get("role") in SYSTEM_ROLES]
    size = sum(map(rough_size, system)) + TOKENS_PER_MESSAGE * len(system)  # about a bound on their tokens
    if system and budgets.fitted_output(entry, requested, fixed + size) < fitted:
        encoding = encoding_for_model(entry.model)
        fixed += await compute(size, lambda: sum(count_message(message, encoding) for message in system))
        fitted = budgets.fitted_output(entry, requested, fixed)
    if fitted == requested:
        return conversation
    params = {**conversation.params, conversation.max_output_param: fitted}
    return replace(conversation, max_output=fitted, params=params)


async def counted(entry: ModelEntry, conversation: Conversation) -> Conversation:
    """`conversation` with what its definitions cost (`Conversation.definitions`)."""
    params = conversation.params
    if not params.get("tools") and not params.get("response_format"):
        return conversation
    tools = params.get("tools")
    size = TOOL_CHARS * (1 + (len(tools) if isinstance(tools, list) else 0))  # no walk to decide where to count
    definitions = await compute(size, count_definitions, params, encoding_for_model(entry.model))
    return replace(conversation, definitions=definitions)


def request_budget(
    budgets: Budgets, entry: ModelEntry, conversation: Conversation, settings: Mapping[str, Any]
) -> Budget:
    """The request's budget; a 400 when its output request or its definitions leave its messages no room."""
    budget = budgets.budget(entry, conversation.max_output, settings, conversation.definitions)
    if budget.input_budget <= 0:
        raise ContextTooLarge(
            f"max_tokens={budget.reserved_output} leaves no room for input in the "
            f"{budget.limits.context_window}-token context window of model '{entry.name}'.",
            param=conversation.max_output_param,
        )
    if budget.for_messages <= 0:
        raise ContextTooLarge(
            f"The request's tool definitions ({budget.definitions} tokens) leave no room for messages in the "
            f"{budget.input_budget}-token input budget of model '{entry.name}'. Send fewer tools or use a model "
            "with a larger context window.",
            param="tools",
        )
    return budget


async def count_tokens(config: Config, budgets: Budgets, compactor: Compactor, conversation: Conversation) -> int:
    """What the proxy would send for `conversation`, by its own count, definitions (tools) included: the
    conversation as it stands while it fits, else about the size compaction brings it to (`compact_to` of what
    the system prompt and the definitions leave of the model's input budget: `Policy.level`)."""
    entry = model_entry(config, conversation.model)
    conversation = await counted(entry, conversation)
    encoding = encoding_for_model(entry.model)
    size = sum(map(rough_size, conversation.messages))
    counts = await compute(size, lambda: [count_message(m, encoding) for m in conversation.messages])
    budget = budgets.budget(entry, None, {}, conversation.definitions)
    policy = compactor.policy(budget.for_messages, config.context.preserve_recent)
    floor = count_prompt(c for c, m in zip(counts, conversation.messages, strict=True) if m.get("role") in SYSTEM_ROLES)
    tokens = count_prompt(counts)
    if tokens > policy.level(policy.trigger_ratio, floor):
        tokens = int(policy.level(policy.compact_to, floor))
    return tokens + budget.definitions
