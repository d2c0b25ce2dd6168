"""Logging set-up: one line per event, level from LogSeverityScreen, structured fields.

Every line is `time level logger: message key=value ...`; code attaches fields through
`extra={"fields": {...}}` (or `log_fields(...)`), e.g. the resource, endpoint or map
involved, so that `grep endpoint=prod/api` finds a problem's whole story. Values with spaces
are quoted.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LEVELS = {"Debug": logging.DEBUG, "Info": logging.INFO, "Warning": logging.WARNING,
          "Error": logging.ERROR, "Fatal": logging.CRITICAL}


def log_fields(**fields: Any) -> dict[str, Any]:
    """`log.info("applied", extra=log_fields(map="ipsets", entries=3))`."""
    return {"fields": fields}


def _format_value(value: Any) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class FieldsFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record).replace("\n", " | ")
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={_format_value(v)}" for k, v in fields.items())
        return line


def configure_logging(severity: str = "Info", stream: Any = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(FieldsFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS.get(severity, logging.INFO))
