"""Budget: how many input tokens a working context may use for one request (docs/architecture.md).

`limits` resolves a model's window and output limit, `corrections` learns how the upstream's tokenizer differs
from ours, and `budgets` combines them with the request and the session into the one effective budget.
"""
