"""The proxy's log format: text lines, or one JSON object per line (`logging.format: json`) for a collector.

Both carry the same fields: time, level, logger and message; a JSON record adds, as keys of their own, the
structured fields a line was logged with (`extra={"fields": {...}}`, which the text line shows as `key=value`
in its message) and, for uvicorn's access lines, the client, method, path and status. uvicorn's own loggers go
through the same handler, so one process writes one format. An access line's path is logged with its query, and
Google's clients may send their key as `?key=`: its value is masked (`MaskedQueryKeys`) before any format sees it.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS_ATTRIBUTE = "fields"
"""`extra={"fields": {...}}` on a log call: structured fields, JSON keys of their own."""
_ACCESS_ARGS = ("client", "method", "path", "http_version", "status")
"""uvicorn.access logs `'%s - "%s %s HTTP/%s" %d'` with these arguments."""


_QUERY_KEY = re.compile(r"(?<=[?&])key=[^&#\s]*")
MASKED_KEY = "key=***"


class MaskedQueryKeys(logging.Filter):
    """An access line's `?key=` (Gemini's clients may send their key there) masked: keys never reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            path = record.args[2]
            if isinstance(path, str) and "key=" in path:
                record.args = (*record.args[:2], _QUERY_KEY.sub(MASKED_KEY, path), *record.args[3:])
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS_ATTRIBUTE, None)
        if isinstance(fields, dict):
            entry.update({key: value for key, value in fields.items() if key not in entry})
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            entry.update(zip(_ACCESS_ARGS, record.args, strict=True))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_config(log_format: str, level: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` for the process, uvicorn's loggers included (uvicorn.run takes it too)."""
    formatter: dict[str, Any] = {"()": f"{__name__}.JsonFormatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"proxy": formatter},
        "filters": {"masked_keys": {"()": f"{__name__}.MaskedQueryKeys"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "proxy",
                "filters": ["masked_keys"],
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            name: {"handlers": [], "propagate": True, "level": level.upper()}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }
