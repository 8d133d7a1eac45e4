"""`proxy.journal.costs`: each summarizer call put in the step it ended in, and a session's totals."""

from __future__ import annotations

from proxy.cost import TokenCost
from proxy.journal.costs import StepCost, session_cost, with_summarizer_calls


def step(step_id: int, created_at: float, sent: int = 1000, cached: int = 0) -> StepCost:
    return StepCost(
        step_id, created_at, "sealed", "m", TokenCost(sent, cached, 0, 10), counted=sent, requested=2 * sent
    )


def test_a_call_goes_to_the_latest_step_begun_before_it_ended_and_an_early_one_to_the_first() -> None:
    steps = [step(1, 10.0), step(2, 20.0), step(3, 30.0)]
    calls = [(5.0, TokenCost(100, 0, 0, 10)), (20.0, TokenCost(200, 50, 0, 20)), (25.0, TokenCost(300, 0, 0, 30))]
    placed = with_summarizer_calls(steps, calls)
    assert [s.summarizer_calls for s in placed] == [1, 2, 0]
    assert placed[0].summarizer == TokenCost(100, 0, 0, 10)
    assert placed[1].summarizer == TokenCost(500, 50, 0, 50)
    assert placed[1].as_json()["summarizer_tokens"] == 550
    assert with_summarizer_calls([], calls) == []


def test_a_session_s_totals_and_cached_share() -> None:
    steps = with_summarizer_calls([step(1, 1.0, 2000, 0), step(2, 2.0, 3000, 2048)], [(1.5, TokenCost(400, 0, 0, 40))])
    total = session_cost(steps)
    assert total["steps"] == 2
    assert (total["sent_tokens"], total["cached_tokens"], total["completion_tokens"]) == (5000, 2048, 20)
    assert total["cached_share"] == round(2048 / 5000, 4)
    assert (total["counted_tokens"], total["requested_tokens"]) == (5000, 10000)
    assert (total["summarizer_calls"], total["summarizer_prompt_tokens"], total["summarizer_completion_tokens"]) == (
        1,
        400,
        40,
    )
    assert session_cost([])["cached_share"] is None
