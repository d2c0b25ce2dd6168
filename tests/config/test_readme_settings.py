"""The README's settings lists name exactly what the code implements (agent.config.PARAMS)."""

from __future__ import annotations

import re
from pathlib import Path

from pyfelix.agent.config import PARAMS
from pyfelix.agent.felix_params import FELIX_PARAMS_BY_KEY

README = Path(__file__).resolve().parents[2] / "README.md"


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end, text.index(start))]


def _mentioned(name: str, section: str) -> bool:
    """`name` written out, or in a group "FirstName / Part / Part" whose first name's
    beginning joined to a part gives it ("BPFMapSizeConntrack / IPSets" holds
    BPFMapSizeIPSets)."""
    if re.search(rf"\b{name}\b", section):
        return True
    for group in re.finditer(r"\b([A-Z][A-Za-z0-9]*)((?:\s*/\s*[A-Za-z0-9]+)+)", section):
        first = group.group(1)
        parts = [part.strip() for part in group.group(2).split("/") if part.strip()]
        if any(first[:k] + part == name for part in parts for k in range(len(first))):
            return True
    return False


def test_implemented_count_and_names_match_the_code() -> None:
    text = README.read_text()
    felix = [p.name for p in PARAMS if p.name.lower() in FELIX_PARAMS_BY_KEY]
    own = [p.name for p in PARAMS if p.name.lower() not in FELIX_PARAMS_BY_KEY]
    m = re.search(r"\*\*Implemented \((\d+) of Felix's\):\*\*", text)
    assert m and int(m.group(1)) == len(felix), (m and m.group(1), len(felix))
    m = re.search(r"\*\*Accepted, not implemented \(the other (\d+)\):\*\*", text)
    assert m and int(m.group(1)) == len(FELIX_PARAMS_BY_KEY) - len(felix)
    implemented = _section(text, "**Implemented (", "**Accepted, not implemented")
    assert not [n for n in felix if not _mentioned(n, implemented)]
    ours = _section(text, "**pyfelix's own:**", "**Restart or live")
    assert not [n for n in own if not _mentioned(n, ours)]
