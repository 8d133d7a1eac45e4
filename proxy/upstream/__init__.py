"""The upstream: the model a working context is sent to (docs/architecture.md).

`protocol` is the seam every caller uses (and tests fake): one `UpstreamCall` value per call. `router` is the
implementation, which sends each call to chat through LiteLLM (`litellm_client`) or to the client of a native API
(`natives`, one list), and `failures` the one boundary where a foreign exception becomes an `UpstreamError`;
there `context_window` recognizes a refusal of the prompt as too long in any provider's words, and `credentials`
names the provider keys a model lacks.
"""
