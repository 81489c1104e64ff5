"""`--log-format json` for the long-running commands (`nvmon daemon`, `nvmon fleet`): one JSON object
per line on stderr, for journald / Loki / any log shipper that parses JSON.

    {"time": "2026-12-05T02:30:01.123Z", "level": "info", "logger": "nvmon.fleet", "message": "..."}

`time` is UTC, ISO 8601 with milliseconds; `level` is logging's level name in lower case;
`exception` (the traceback text) and `stack` are added when a record carries them. Nothing but
the standard library: a `logging.Formatter`.
"""

from __future__ import annotations

import json
import logging
import time

LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One record → one line of JSON (a message with line breaks stays one line: JSON escapes them)."""

    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)
