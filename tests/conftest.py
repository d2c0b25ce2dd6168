"""Suite-wide: agents the tests start log to stderr only (their harness captures it), never
to Felix's default log file (/var/log/calico/felix.log) or the machine's syslog."""

from __future__ import annotations

import os

os.environ.setdefault("FELIX_LOGFILEPATH", "none")
os.environ.setdefault("FELIX_LOGSEVERITYSYS", "none")
