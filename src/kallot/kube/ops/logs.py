"""Structured logs for the live scheduler: ``key=value`` text, or one JSON object per line.

Log calls stay lazy (``logger.info("bound pod=%s node=%s", ...)``, style guide); the formatter
renders the message and, in JSON mode, lifts every ``key=value`` pair of it into a field, so
``jq 'select(.pod == "ml/train-0")'`` works without a second logging API.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys

_PAIR = re.compile(r"(\w+)=(\"[^\"]*\"|\S+)")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, object] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            # The words before the first key=value pair ("bind failed pod=... node=...").
            "msg": message[: first.start()].strip()
            if (first := _PAIR.search(message))
            else message,
        }
        for key, value in _PAIR.findall(message):
            if key not in out:
                out[key] = value.strip('"')
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


MAX_FIELD_CHARS = 300


def truncate(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """``text`` cut to ``limit`` characters for a log line (the full length said)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure(level: str = "info", fmt: str = "text") -> None:
    """Root logging for a process: stderr, ``fmt`` 'text' or 'json'."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The HTTP client logs every connection at DEBUG; keep it out of -v runs.
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
