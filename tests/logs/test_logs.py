"""One line per event with structured fields."""

from __future__ import annotations

import io
import logging
import socket

from pyfelix.agent.logs import LogSinks, configure_logging, log_fields


def test_fields_are_appended_and_quoted() -> None:
    stream = io.StringIO()
    configure_logging("Debug", stream)
    logging.getLogger("pyfelix.test").warning(
        "rejected\nresource", extra=log_fields(resource="NetworkPolicy(x/p)", reason="bad port"))
    line = stream.getvalue()
    assert line.count("\n") == 1
    assert 'resource=NetworkPolicy(x/p) reason="bad port"' in line
    assert "WARNING pyfelix.test: rejected | resource" in line


def test_severity_filters() -> None:
    stream = io.StringIO()
    configure_logging("Error", stream)
    logging.getLogger("pyfelix.test").warning("hidden")
    assert stream.getvalue() == ""


# --- Felix's sinks: LogFilePath (rotated), LogSeverityFile, LogSeveritySys, LogSeverityScreen


def _reset_logging() -> None:
    configure_logging("Info", io.StringIO())


def test_file_sink_has_its_own_severity_and_rotates(tmp_path) -> None:
    path = tmp_path / "calico" / "felix.log"  # the directory is created
    screen = io.StringIO()
    try:
        configure_logging(LogSinks(screen="Error", file_path=str(path), file_severity="Debug",
                                   file_max_bytes=2000, file_backups=2), screen)
        log = logging.getLogger("pyfelix.test")
        log.debug("debug line for the file only")
        for i in range(100):
            log.info("filler line %03d %s", i, "x" * 40)
        log.error("an error for both")
    finally:
        _reset_logging()
    assert "debug line" not in screen.getvalue() and "an error for both" in screen.getvalue()
    rotated = sorted(p.name for p in path.parent.iterdir())
    assert rotated == ["felix.log", "felix.log.1", "felix.log.2"]  # 2 backups kept
    assert all(p.stat().st_size <= 2000 for p in path.parent.iterdir())
    assert "an error for both" in path.read_text()


def test_syslog_sink_sends_to_the_socket_at_its_severity(tmp_path) -> None:
    address = str(tmp_path / "syslog.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(address)
    server.settimeout(2)
    try:
        configure_logging(LogSinks(screen="", sys_severity="Warning", sys_address=address),
                          io.StringIO())
        log = logging.getLogger("pyfelix.test")
        log.info("not for syslog")
        log.warning("for syslog", extra=log_fields(endpoint="ns/pod"))
        datagram = server.recv(4096).decode()
    finally:
        _reset_logging()
        server.close()
    # <12> = facility user (1) * 8 + warning (4)
    assert datagram.startswith("<12>pyfelix[")
    assert "WARNING pyfelix.test: for syslog endpoint=ns/pod" in datagram
    assert "not for syslog" not in datagram


def test_missing_syslog_socket_or_unwritable_file_is_reported_not_fatal(tmp_path) -> None:
    screen = io.StringIO()
    blocker = tmp_path / "file"
    blocker.write_text("")
    try:
        problems = configure_logging(LogSinks(
            screen="Info", sys_severity="Info", sys_address=str(tmp_path / "no-socket"),
            file_path=str(blocker / "felix.log")), screen)
        logging.getLogger("pyfelix.test").info("still logging")
    finally:
        _reset_logging()
    assert len(problems) == 2
    assert "LogSeveritySys" in problems[0] or "LogSeveritySys" in problems[1]
    assert "log sink skipped" in screen.getvalue() and "still logging" in screen.getvalue()


def test_severity_none_turns_a_sink_off() -> None:
    screen = io.StringIO()
    try:
        configure_logging(LogSinks(screen=""), screen)
        logging.getLogger("pyfelix.test").critical("nowhere")
    finally:
        _reset_logging()
    assert screen.getvalue() == ""


def test_a_full_syslog_socket_drops_lines_and_never_blocks(tmp_path) -> None:
    from prometheus_client import REGISTRY

    address = str(tmp_path / "slow-syslog.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(address)  # never read: its queue fills
    before = REGISTRY.get_sample_value("pyfelix_log_lines_dropped_total",
                                       {"sink": "syslog"}) or 0.0
    try:
        configure_logging(LogSinks(screen="", sys_severity="Info", sys_address=address),
                          io.StringIO())
        for i in range(2000):  # far beyond any datagram queue; would hang if blocking
            logging.getLogger("pyfelix.test").info("line %d", i)
    finally:
        _reset_logging()
        server.close()
    dropped = REGISTRY.get_sample_value("pyfelix_log_lines_dropped_total",
                                        {"sink": "syslog"}) - before
    assert 0 < dropped < 2000
