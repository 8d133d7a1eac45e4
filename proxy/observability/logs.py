"""The proxy's log format: text lines, or one JSON object per line (`logging.format: json`) for a collector.

Both carry the same fields: time, level, logger and message; a JSON record adds, as keys of their own, the
structured fields a line was logged with (`extra={"fields": {...}}`, which the text line shows as `key=value`
in its message) and, for uvicorn's access lines, the client, method, path and status. uvicorn's own loggers go
through the same handler, so one process writes one format.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS_ATTRIBUTE = "fields"
"""`extra={"fields": {...}}` on a log call: structured fields, JSON keys of their own."""
_ACCESS_ARGS = ("client", "method", "path", "http_version", "status")
"""uvicorn.access logs `'%s - "%s %s HTTP/%s" %d'` with these arguments."""


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
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "proxy", "stream": "ext://sys.stderr"}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            name: {"handlers": [], "propagate": True, "level": level.upper()}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }
