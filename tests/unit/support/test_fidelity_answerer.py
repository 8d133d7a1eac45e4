"""The fidelity bench's real-model mode (`--answer-url`): each question goes with its context to an OpenAI-compatible
server, and the answer counts as correct only when it holds the gold phrase. No model can be loaded here, so a
real HTTP server on 127.0.0.1 answers from the context it was sent, as a reader that found the fact would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.fidelity import Answerer
from bench.harness.conversations import Question
from proxy.tokens import content_text
from tests.support.fake_upstream import FakeUpstream, Fault, Reply

QUESTION = Question("When did Caroline go to the support group?", "7 May 2023", ("D1:3",), "temporal")


def reader(body: dict[str, Any]) -> Reply:
    """Answers with the sentence of the context that mentions the support group, or says it does not know."""
    said = [content_text(m["content"]) for m in body["messages"][:-1]]
    found = next((line for line in said if "support group" in line), None)
    return Reply(content=found or "I don't know.")


@pytest.fixture
def answering() -> Iterator[FakeUpstream]:
    with FakeUpstream() as fake:
        fake.responder = reader
        yield fake


def context(*said: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Answer from the conversation."},
        *({"role": "user", "content": line} for line in said),
        {"role": "user", "content": QUESTION.text},
    ]


def test_an_answer_holding_the_gold_phrase_is_correct_and_one_without_it_is_not(answering: FakeUpstream) -> None:
    answerer = Answerer(answering.url, "reader")

    kept = context("Caroline: I went to the LGBTQ support group on 7 May, 2023.")
    assert answerer.correct(kept, QUESTION)
    assert not answerer.correct(context("Caroline: Thanks, Melanie!"), QUESTION)

    asked = answering.requests[0]
    assert asked.body["model"] == "reader"
    assert asked.body["temperature"] == 0
    assert [m["content"] for m in asked.body["messages"]] == [m["content"] for m in kept]


def test_the_key_comes_from_the_environment(answering: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSWER_API_KEY", "sk-answer")

    Answerer(answering.url, "reader").correct(context(), QUESTION)

    assert answering.requests[0].headers["authorization"] == "Bearer sk-answer"


def test_a_model_server_that_fails_stops_the_run_instead_of_counting_a_wrong_answer(answering: FakeUpstream) -> None:
    answering.fail_next(Fault(status=503))

    with pytest.raises(httpx.HTTPStatusError):
        Answerer(answering.url, "reader").correct(context(), QUESTION)
