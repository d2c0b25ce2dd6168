"""Logging set-up as Felix's: stderr, a rotated log file and syslog, each with its severity.

Sinks (`LogSinks`, from the agent's configuration): stderr at LogSeverityScreen, the file
LogFilePath at LogSeverityFile (rotated when it reaches LogFileMaxSizeMB, LogFileBackups old
files kept as felix.log.1...), and syslog at LogSeveritySys through the unix datagram socket
LogSyslogAddress (RFC 3164 lines, facility user). A severity or path of "" (Felix's `none`)
turns that sink off. Syslog is written without ever blocking: a full or vanished socket
loses the line (`pyfelix_log_lines_dropped_total{sink="syslog"}`). A sink that cannot be
opened (no syslog socket, an unwritable directory) is reported on the other sinks and
skipped: logging never stops the agent.
`configure_logging` may be called again with new severities (they apply live); it replaces
the handlers it installed before.

Every line is `time level logger: message key=value ...`; code attaches fields through
`extra={"fields": {...}}` (or `log_fields(...)`), e.g. the resource, endpoint or map
involved, so that `grep endpoint=prod/api` finds a problem's whole story. Values with spaces
are quoted.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Counter

LEVELS = {"Trace": logging.DEBUG, "Debug": logging.DEBUG, "Info": logging.INFO,
          "Warning": logging.WARNING, "Error": logging.ERROR, "Fatal": logging.CRITICAL}


@dataclass(frozen=True)
class LogSinks:
    screen: str = "Info"  # severities: a LEVELS key, or "" for off
    file_path: str = ""
    file_severity: str = "Info"
    sys_severity: str = ""
    sys_address: str = "/dev/log"
    file_max_bytes: int = 100 * 1024 * 1024
    file_backups: int = 5


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


class _SyslogFormatter(FieldsFormatter):
    """Syslog adds its own time stamp and priority: the line starts at the program name."""

    def __init__(self) -> None:
        logging.Formatter.__init__(self, "pyfelix[%(process)d]: %(levelname)s %(name)s: "
                                         "%(message)s")


LOG_LINES_DROPPED = Counter(
    "pyfelix_log_lines_dropped",
    "Log lines a sink could not take (syslog's socket full or gone); never waited for.",
    ["sink"],
)


class _NonBlockingSysLogHandler(logging.handlers.SysLogHandler):
    """Syslog through a non-blocking socket: a slow or stuck syslog daemon (its receive
    queue full) or one that went away loses lines, counted, instead of blocking the agent's
    threads on a log call; no traceback per lost line on the other sinks."""

    def __init__(self, address: str) -> None:
        super().__init__(address=address, socktype=socket.SOCK_DGRAM)
        self.socket.setblocking(False)

    def _connect_unixsocket(self, address: Any) -> None:
        super()._connect_unixsocket(address)  # type: ignore[misc]
        self.socket.setblocking(False)

    def handleError(self, record: logging.LogRecord) -> None:
        LOG_LINES_DROPPED.labels("syslog").inc()


def _open_syslog(address: str) -> logging.Handler:
    if not stat.S_ISSOCK(os.stat(address).st_mode):
        raise OSError(f"{address} is not a unix socket")
    return _NonBlockingSysLogHandler(address)


def _level(severity: str) -> int:
    return LEVELS.get(severity, logging.INFO)


def configure_logging(severity: str | LogSinks = "Info", stream: Any = None) -> list[str]:
    """Install the sinks (a plain severity: stderr only). Returns the problems met opening
    sinks (also logged), so a caller or test can see them."""
    sinks = severity if isinstance(severity, LogSinks) else LogSinks(screen=severity)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if getattr(old, "_pyfelix_sink", False):
            old.close()
    handlers: list[logging.Handler] = []
    problems: list[str] = []
    if sinks.screen:
        screen = logging.StreamHandler(stream or sys.stderr)
        screen.setFormatter(FieldsFormatter())
        screen.setLevel(_level(sinks.screen))
        handlers.append(screen)
    if sinks.file_path and sinks.file_severity:
        try:
            Path(sinks.file_path).parent.mkdir(parents=True, exist_ok=True)
            rotating = logging.handlers.RotatingFileHandler(
                sinks.file_path, maxBytes=sinks.file_max_bytes,
                backupCount=max(sinks.file_backups, 0), encoding="utf-8")
        except OSError as exc:
            problems.append(f"LogFilePath {sinks.file_path}: cannot open: {exc}")
        else:
            rotating.setFormatter(FieldsFormatter())
            rotating.setLevel(_level(sinks.file_severity))
            handlers.append(rotating)
    if sinks.sys_severity and sinks.sys_address:
        try:
            syslog = _open_syslog(sinks.sys_address)
        except OSError as exc:
            problems.append(f"LogSeveritySys: syslog socket {sinks.sys_address}: {exc}")
        else:
            syslog.setFormatter(_SyslogFormatter())
            syslog.setLevel(_level(sinks.sys_severity))
            handlers.append(syslog)
    for handler in handlers:
        handler._pyfelix_sink = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    levels = [h.level for h in handlers]
    root.setLevel(min(levels) if levels else logging.CRITICAL + 1)
    for problem in problems:
        logging.getLogger(__name__).warning("log sink skipped: %s", problem)
    return problems
