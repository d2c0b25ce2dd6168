"""BIRD's command-line tools: check a config, reload a running BIRD, ask for protocol states;
and, for tests and the lab only, a BIRD daemon inside a network namespace.

Role: the only place confd starts `bird` / `birdc` processes.

- `BirdTools.check(path)`: `bird -p -c PATH` (parse only: no sockets, no protocols start);
- `BirdTools.configure(socket)`: `birdc -s SOCKET configure` (BIRD re-reads the file it was
  started with);
- `BirdTools.protocols(socket)`: `birdc -s SOCKET show protocols`, parsed;
- `BirdInstance`: `ip netns exec NS bird -f -c CONF -s SOCKET -P PIDFILE`, stopped by pid.

Inputs: paths, a control socket, a command runner (`agent.shims.cmd.CommandRunner`, injected
for tests). Outputs: `BirdResult` / `ProtocolState` values; command failures (missing binary,
timeout, non-zero exit) become `ok=False` results with the reason, never exceptions.

Invariants: `BirdInstance` refuses to start without a named network namespace that exists
(it never runs BIRD in the machine's own namespace), and `stop()` ends only the process it
started (by its pid), waiting for it to exit.

Easy to get wrong: `birdc` exits 0 even when BIRD rejects the new config, so success is read
from the reply codes in its output ("Reconfigured", "Reconfiguration in progress").
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pyfelix.agent.shims.cmd import CommandError, CommandRunner, NetnsCommandRunner, netns_path

log = logging.getLogger(__name__)

BIRD = "bird"
BIRDC = "birdc"
COMMAND_TIMEOUT = 30.0
# `birdc configure` replies that mean BIRD accepted the new config
_CONFIGURE_OK = ("Reconfigured", "Reconfiguration in progress",
                 "Reconfiguration already in progress")


@dataclass(frozen=True)
class BirdResult:
    ok: bool
    message: str  # the tool's output (or the reason it could not run)


@dataclass(frozen=True)
class ProtocolState:
    name: str
    proto: str  # "BGP", "Kernel", "Device", ...
    state: str  # "up", "start", "down"
    info: str  # "Established", "Active", "Connect", ... (the rest of the line)

    @property
    def established(self) -> bool:
        return self.proto == "BGP" and "Established" in self.info.split()


class BirdTools:
    """bird/birdc invocations through a command runner."""

    def __init__(self, *, runner: CommandRunner | None = None, bird: str = BIRD,
                 birdc: str = BIRDC, timeout: float = COMMAND_TIMEOUT) -> None:
        self._runner = runner or NetnsCommandRunner(None)
        self._bird = bird
        self._birdc = birdc
        self._timeout = timeout

    def _run(self, argv: list[str]) -> BirdResult:
        try:
            result = self._runner.run(argv, check=False, timeout=self._timeout)
        except CommandError as exc:
            return BirdResult(False, str(exc))
        output = (result.stdout + result.stderr).strip()
        return BirdResult(result.returncode == 0, output)

    def check(self, config_path: str | os.PathLike[str]) -> BirdResult:
        """Parse-only check of a config file (`bird -p`)."""
        result = self._run([self._bird, "-p", "-c", os.fspath(config_path)])
        if not result.ok and not result.message:
            return BirdResult(False, "bird -p failed without a message")
        return result

    def configure(self, socket_path: str | os.PathLike[str]) -> BirdResult:
        """Ask the BIRD behind `socket_path` to reload its config file."""
        result = self._run([self._birdc, "-s", os.fspath(socket_path), "configure"])
        accepted = any(line.strip().startswith(_CONFIGURE_OK)
                       for line in result.message.splitlines())
        return BirdResult(result.ok and accepted, result.message)

    def protocols(self, socket_path: str | os.PathLike[str]) -> list[ProtocolState]:
        """`show protocols`, parsed; [] when BIRD does not answer."""
        result = self._run([self._birdc, "-s", os.fspath(socket_path), "show", "protocols"])
        if not result.ok:
            return []
        return parse_show_protocols(result.message)

    def show_route(self, socket_path: str | os.PathLike[str], *args: str) -> BirdResult:
        return self._run([self._birdc, "-s", os.fspath(socket_path), "show", "route", *args])


def parse_show_protocols(text: str) -> list[ProtocolState]:
    """Rows of `birdc show protocols` (header and banner skipped).

    Columns: Name Proto Table State Since Info; Since is one token (a time) or two (a date
    and a time) depending on BIRD's timeformat, so Info is found after the token that looks
    like a time (contains ':').
    """
    states = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[0] in ("BIRD", "Name") or parts[0].startswith("0"):
            continue
        name, proto, _table, state = parts[:4]
        rest = parts[4:]
        since_end = next((i for i, tok in enumerate(rest) if ":" in tok), 0)
        info = " ".join(rest[since_end + 1:])
        states.append(ProtocolState(name, proto, state, info))
    return states


class BirdInstance:
    """One BIRD daemon in a named network namespace, for tests and the lab."""

    def __init__(self, netns: str, config_path: str | os.PathLike[str],
                 socket_path: str | os.PathLike[str], *, run_dir: str | os.PathLike[str],
                 bird: str = BIRD) -> None:
        if not netns:
            raise ValueError("BirdInstance needs a network namespace: BIRD never runs in the "
                             "machine's own namespace")
        self.netns = netns
        self.config_path = Path(config_path)
        self.socket_path = Path(socket_path)
        self.run_dir = Path(run_dir)
        self.pid_path = self.run_dir / "bird.pid"
        self.log_path = self.run_dir / "bird.log"
        self._bird = bird
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self, *, ready_timeout: float = 10.0) -> None:
        """Start BIRD in the foreground of a child process; wait for its control socket."""
        if not os.path.exists(netns_path(self.netns)):
            raise FileNotFoundError(f"network namespace {self.netns!r} does not exist")
        if self._process is not None:
            raise RuntimeError(f"BIRD in {self.netns} already started")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            # `ip netns exec` execs bird, so the child's pid is BIRD's own pid
            self._process = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, self._bird, "-f",
                 "-c", str(self.config_path), "-s", str(self.socket_path),
                 "-P", str(self.pid_path)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"BIRD in {self.netns} exited with {self._process.returncode}:"
                                   f" {self.log_text()[-2000:]}")
            if self.socket_path.exists():
                return
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"BIRD in {self.netns}: no control socket after {ready_timeout} s")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, *, timeout: float = 5.0) -> None:
        """Terminate (then kill) the BIRD this object started; idempotent."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("BIRD pid %d in %s ignored SIGTERM; killing it", process.pid, self.netns)
            process.kill()
            process.wait(timeout=timeout)
