"""The log format: JSON records carry the text line's fields (and the structured ones as keys of their own),
and a served proxy with `logging.format: json` writes nothing but JSON lines."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import httpx

from proxy.compaction.events import CompactionEvent, log_fields, log_line
from proxy.observability.logs import FIELDS_ATTRIBUTE, TEXT_FORMAT, JsonFormatter
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyProcess, make_config
from tests.support.scripted_session import filler, install_responder, seeded

EVENT = CompactionEvent(
    "s1", "complete", "summarize", 2, 14, 5120, 410, 12.5, 7, "llm", "summarizer", detail='he said "no"'
)


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("proxy.compaction.events", logging.INFO, __file__, 1, message, args or None, None)
    made.__dict__.update(extra)
    return made


def test_a_json_record_has_the_text_lines_fields() -> None:
    line = record("%s", log_line(EVENT), **{FIELDS_ATTRIBUTE: log_fields(EVENT)})

    text = logging.Formatter(TEXT_FORMAT).format(line)
    entry = json.loads(JsonFormatter().format(line))

    stamp, level, logger, message = text.split(" ", 4)[1:]  # date, time, level, logger:, message
    assert (
        (entry["level"], entry["logger"] + ":", entry["message"])
        == (level, logger, message)
        == (
            "INFO",
            "proxy.compaction.events:",
            log_line(EVENT),
        )
    )
    assert entry["time"][11:19] == stamp[:8]
    assert {key: entry[key] for key in ("event", "session", "strategy", "range", "tokens", "summary")} == {
        "event": "complete",
        "session": "s1",
        "strategy": "summarize",
        "range": "[2,14)",
        "tokens": "5120->410",
        "summary": 7,
    }
    assert entry["detail"] == 'he said "no"'
    assert 'detail="he said \\"no\\""' in message


def test_exceptions_and_access_lines_become_fields() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        failing = logging.LogRecord(
            "proxy.serving.app", logging.ERROR, __file__, 1, "failed on %s", ("/x",), sys.exc_info()
        )
    entry = json.loads(JsonFormatter().format(failing))
    assert entry["message"] == "failed on /x"
    assert "ValueError: boom" in entry["exception"]

    access = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("1.2.3.4:5", "GET", "/x", "1.1", 200),
        None,
    )
    entry = json.loads(JsonFormatter().format(access))
    assert entry["message"] == '1.2.3.4:5 - "GET /x HTTP/1.1" 200'
    assert (entry["method"], entry["path"], entry["status"], entry["client"]) == ("GET", "/x", 200, "1.2.3.4:5")


def test_a_served_proxy_writes_json_lines_only(tmp_path: Path, fake: FakeUpstream) -> None:
    install_responder(fake)
    raw = make_config(tmp_path, fake.url, logging={"format": "json", "level": "info"})
    with ProxyProcess(raw, tmp_path, log_level=None) as proxy:
        turns = [
            {"role": "user" if n % 2 == 0 else "assistant", "content": filler(seeded(str(n)), 120)} for n in range(9)
        ]
        body = {"model": "fake", "messages": turns}
        answered = httpx.post(
            f"{proxy.url}/v1/chat/completions", json=body, headers={"X-Session-Id": "logged"}, timeout=20
        )
        assert answered.status_code == 200, answered.text
        summarized = httpx.post(f"{proxy.url}/sessions/logged/summarize", timeout=20)
        assert summarized.status_code == 200, summarized.text
    lines = [line for line in proxy.log_path.read_text().splitlines() if line.strip()]

    entries = [json.loads(line) for line in lines]  # every line is one JSON object

    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries)
    access = [e for e in entries if e["logger"] == "uvicorn.access"]
    assert {(e["method"], e["path"], e["status"]) for e in access} >= {
        ("POST", "/v1/chat/completions", 200),
        ("POST", "/sessions/logged/summarize", 200),
    }
    events = [e for e in entries if e["logger"] == "proxy.compaction.events"]
    assert [e["event"] for e in events] == ["start", "complete"]
    assert events[1]["session"] == "logged"
    assert events[1]["message"].startswith("compaction event=complete session=logged strategy=summarize")
    assert any(e["logger"] == "proxy.serving.app" and e["message"].startswith("serving models") for e in entries)
