"""One line per event with structured fields."""

from __future__ import annotations

import io
import logging

from agent.logs import configure_logging, log_fields


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
