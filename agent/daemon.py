"""The node agent: datastore -> syncer -> validator -> calc graph -> dataplane loop -> kernel.

Wiring (each box is a thread; arrows are queues)::

    syncer ──updates/status──> CalcPipeline ──proto messages──> _Forwarder ──> DataplaneLoop
    (make_syncer(location))    (validator, graph,              (metrics, config   (managers:
                                event sequencer)                 restart check)     apply())
    InterfaceMonitor ──InterfaceUpdate/InterfaceAddrsUpdate───────────────────────────┘
    (the loop and the monitor are one `agent.dataplane.linux.LinuxDataplane`)
    main thread: status file + GC policy (agent.gc_policy) ticks; exits on SIGTERM/SIGINT,
    a fatal dataplane failure (fail closed), or a FelixConfiguration change that needs a
    restart.

Health (agent.health): the calc pipeline, the dataplane loop and the interface monitor each
report their own liveness (and the first two their readiness: in sync / programmed) from
their own threads through a heartbeat callback, so a loop that hangs stops reporting and
/liveness fails after its timeout (defaults below, HealthTimeoutOverrides replaces them;
the dataplane's default is DataplaneWatchdogTimeout). Not reporters: the syncer (each
backend bounds its own reads: etcd keepalives, TyphaReadTimeout), the BPF conntrack cleaner
(its map is an LRU, so a stuck cleaner costs room, never correctness), the status reporter
and this main thread (a hung main thread cannot exit on a fatal dataplane, but that loop
then stops reporting and liveness fails anyway).

Start-up order matters: configuration is loaded from env/file (checked first: bad values
exit 2 at once; health is served from it) AND the datastore's FelixConfiguration resources
before the dataplane is built, so the dataplane mode is decided once. A datastore that cannot
be reached at start is waited for, not an exit: the read is retried with jittered
exponential backoff (0.5 s up to 10 s), each failure logged with the next delay, and
`/readiness` answers 503 with the `datastore` reporter not ready until it answers (a
datastore that answers but refuses, e.g. permission denied, still exits 2). A later
change to a restart-only parameter makes the agent exit 0 so its DaemonSet restarts it with
the new value (as Felix does). SIGTERM stops the threads and leaves the
programmed dataplane (maps, programs, routes, chains) in place: the next agent adopts it.

Exit codes: 0 clean stop or restart-for-config, 1 fatal dataplane failure, 2 bad config.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyfelix.agent import metrics
from pyfelix.agent.atomic_file import write_atomically
from pyfelix.agent.calc.pipeline import CalcPipeline
from pyfelix.agent.config import Config, load_config, note_not_implemented
from pyfelix.agent.dataplane.errors import DataplaneUnavailable
from pyfelix.agent.dataplane.loop import DataplaneLoop
from pyfelix.agent.dataplane.manager import Manager
from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.agent.gc_policy import GcPolicy
from pyfelix.agent.health import HealthAggregator, HealthServer
from pyfelix.agent.proto import (
    ActivePolicyRemove,
    ActivePolicyUpdate,
    ActiveProfileRemove,
    ActiveProfileUpdate,
    ConfigUpdate,
    HostMetadataRemove,
    HostMetadataUpdate,
    IPSetDeltaUpdate,
    IPSetRemove,
    IPSetUpdate,
    WorkloadEndpointRemove,
    WorkloadEndpointUpdate,
)
from pyfelix.agent.syncer.api import DatastoreError, RawUpdate, SyncStatus
from pyfelix.agent.syncer.backoff import Backoff

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_CONFIG = 2

CALC_GRAPH_LIVENESS_TIMEOUT = 60.0
IFACE_MONITOR_LIVENESS_TIMEOUT = 60.0

# Start-up while the datastore cannot be reached: retry with jittered exponential backoff
# from STARTUP_RETRY_INITIAL_S up to STARTUP_RETRY_MAX_S, reported by this health reporter.
DATASTORE_REPORTER = "datastore"
# Not ready until the dataplane exists and has programmed the first complete state: the
# dataplane reporter is registered (never reported, so not ready) before health is first
# served, and replaced by the dataplane loop's own in `_run`. Without it readiness would
# answer 200 between reading the datastore's configuration and building the dataplane
# (BPF programs compiling, or failing to load and the agent exiting).
DATAPLANE_REPORTER = "dataplane"
STARTUP_RETRY_INITIAL_S = 0.5
STARTUP_RETRY_MAX_S = 10.0

_RESYNC_STATE_VALUES = {SyncStatus.WAIT_FOR_DATASTORE: 1, SyncStatus.RESYNC: 2,
                        SyncStatus.IN_SYNC: 3}


ManagersFactory = Callable[[Config], list[Manager]]

LOGGING_PARAMS = ("LogSeverityScreen", "LogSeverityFile", "LogSeveritySys")


def log_sinks(config: Config) -> Any:
    """The logging sinks a configuration asks for (agent.logs.LogSinks)."""
    from pyfelix.agent.logs import LogSinks

    return LogSinks(screen=config.log_severity_screen, file_path=config.log_file_path,
                    file_severity=config.log_severity_file,
                    sys_severity=config.log_severity_sys,
                    sys_address=config.log_syslog_address,
                    file_max_bytes=config.log_file_max_size_mb * 1024 * 1024,
                    file_backups=config.log_file_backups)


def resolve_felix_datastore(local: Config, environ: dict[str, str]) -> DatastoreLocation:
    """No --datastore: the datastore Felix's own settings name (DatastoreType, Etcd*,
    Typha*); the etcd TLS files go into `environ` (and this
    process's environment, where the etcd backend reads them) unless already set there."""
    from pyfelix.agent.felix_datastore import etcd_tls_environ, felix_datastore_location

    location = felix_datastore_location(local, environ)
    for name, path in etcd_tls_environ(local, environ).items():
        environ.setdefault(name, path)
        os.environ.setdefault(name, path)
    log.info("no --datastore: using %s from Felix's datastore settings", location)
    return location


def build_iptables_managers(config: Config) -> list[Manager]:
    from pyfelix.agent.dataplane.linux import LinuxDataplaneConfig, linux_managers

    return linux_managers(LinuxDataplaneConfig.from_config(config, bpf_mode=False))


def build_bpf_managers(config: Config) -> list[Manager]:
    """The BPF maps/programs managers first, then routes and sysctls (rp_filter 0)."""
    from pyfelix.agent.dataplane.linux import LinuxDataplaneConfig, linux_managers

    try:
        from pyfelix.agent.dataplane.bpf_dataplane import build_bpf_managers as build
    except ImportError as exc:
        raise DataplaneUnavailable(f"the BPF dataplane cannot be loaded: {exc}") from exc
    return linux_managers(LinuxDataplaneConfig.from_config(config, bpf_mode=True),
                          extra_managers=build(config))


def select_managers(config: Config) -> tuple[str, list[Manager]]:
    """BPF when enabled; when the kernel cannot run it, fall back ONLY if configured."""
    if not config.bpf_enabled:
        return "iptables", build_iptables_managers(config)
    try:
        return "bpf", build_bpf_managers(config)
    except DataplaneUnavailable as exc:
        if config.bpf_fallback == "iptables":
            log.error("BPF dataplane unavailable (%s); BPFFallback=iptables, using iptables",
                      exc)
            return "iptables", build_iptables_managers(config)
        raise


class _Forwarder:
    """The calc pipeline's target: forwards messages to the dataplane loop, keeping the
    agent-level metrics and watching for configuration that needs a restart."""

    def __init__(self, loop: DataplaneLoop, on_config: Callable[[dict[str, str]], None]):
        self._loop = loop
        self._on_config = on_config
        self.endpoints: set[Any] = set()
        self.policies: set[Any] = set()
        self._profiles: set[Any] = set()
        self._ipsets: dict[str, int] = {}
        self._hosts: set[str] = set()

    def send(self, msg: object) -> None:
        metrics.CALC_GRAPH_OUTPUT_EVENTS.inc()
        self._count(msg)
        if isinstance(msg, ConfigUpdate):
            self._on_config(dict(msg.config))
        self._loop.enqueue(msg)

    def _count(self, msg: object) -> None:
        match msg:
            case WorkloadEndpointUpdate(id=i):
                self.endpoints.add(i)
            case WorkloadEndpointRemove(id=i):
                self.endpoints.discard(i)
            case ActivePolicyUpdate(id=i):
                self.policies.add(i)
            case ActivePolicyRemove(id=i):
                self.policies.discard(i)
            case ActiveProfileUpdate(id=i):
                self._profiles.add(i)
            case ActiveProfileRemove(id=i):
                self._profiles.discard(i)
            case IPSetUpdate(id=i, members=m):
                self._ipsets[i] = len(m)
            case IPSetDeltaUpdate(id=i, added=a, removed=r):
                self._ipsets[i] = self._ipsets.get(i, 0) + len(a) - len(r)
            case IPSetRemove(id=i):
                self._ipsets.pop(i, None)
            case HostMetadataUpdate(hostname=h):
                self._hosts.add(h)
            case HostMetadataRemove(hostname=h):
                self._hosts.discard(h)
            case _:
                return
        metrics.ACTIVE_LOCAL_ENDPOINTS.set(len(self.endpoints))
        metrics.ACTIVE_LOCAL_POLICIES.set(len(self.policies))
        metrics.ACTIVE_LOCAL_PROFILES.set(len(self._profiles))
        metrics.IPSETS.set(len(self._ipsets))
        metrics.IPSET_MEMBERS.set(sum(self._ipsets.values()))
        metrics.CLUSTER_NUM_HOSTS.set(len(self._hosts))


class _SyncerTap:
    """Syncer callbacks in front of the pipeline that remember when updates last arrived
    (the status file reports it, so the lab knows the agent has seen its writes)."""

    def __init__(self, pipeline: CalcPipeline) -> None:
        self._pipeline = pipeline
        self.last_update_wall = 0.0
        self.status = SyncStatus.WAIT_FOR_DATASTORE

    def on_status(self, status: SyncStatus) -> None:
        self.status = status
        metrics.RESYNC_STATE.set(_RESYNC_STATE_VALUES[status])
        self._pipeline.on_status(status)

    def on_updates(self, updates: list[RawUpdate]) -> None:
        self._pipeline.on_updates(updates)
        self.last_update_wall = time.time()

    def on_error(self, error: DatastoreError) -> None:
        self._pipeline.on_error(error)
        self.last_update_wall = time.time()


def datastore_felix_config(datastore: DatastoreLocation,
                           hostname: str) -> tuple[dict[str, str], dict[str, str]]:
    """FelixConfiguration `default` and `node.<hostname>` as read at start-up.

    Raises `DatastoreUnavailable` when the datastore cannot be reached (the agent waits and
    retries), another `DatastoreClientError` when it refuses (the agent exits 2)."""
    from pyfelix.agent.datastore import open_datastore
    from pyfelix.agent.model import FelixConfiguration, ValidationError, parse_resource

    if datastore.backend == "typha":
        # Typha is read-only: take the effective (global, then per-node) settings from one
        # pass of its stream through the calc graph, as the running agent will see them.
        from pyfelix.agent.calc.snapshot import CalcTimeout, compute
        from pyfelix.agent.syncer.client import DatastoreUnavailable

        try:
            return dict(compute(datastore, hostname).state.config), {}
        except CalcTimeout as exc:
            raise DatastoreUnavailable(str(exc)) from exc

    client = open_datastore(datastore)
    layers: list[dict[str, str]] = []
    for name in ("default", f"node.{hostname}"):
        docs = client.get("FelixConfiguration", name)
        settings: dict[str, str] = {}
        for doc in docs:
            try:
                resource = parse_resource(doc)
            except ValidationError as exc:
                log.error("ignoring invalid FelixConfiguration: %s", exc)
                continue
            if isinstance(resource, FelixConfiguration):
                settings = dict(resource.settings)
        layers.append(settings)
    return layers[0], layers[1]


@dataclass
class AgentOptions:
    datastore: DatastoreLocation | None  # None: from Felix's settings (DatastoreType...)
    hostname: str
    config_file: str | None = None
    environ: dict[str, str] | None = None


class Agent:
    def __init__(self, options: AgentOptions, *,
                 managers_factory: Callable[[Config], tuple[str, list[Manager]]] | None = None,
                 monitor_interfaces: bool = True, startup_backoff: Backoff | None = None
                 ) -> None:
        self.options = options
        self._managers_factory = managers_factory or select_managers
        self._monitor_interfaces = monitor_interfaces
        self._stop = threading.Event()
        self._restart_reason: str | None = None
        self.environ = dict(os.environ if options.environ is None else options.environ)
        self.config: Config | None = None
        self.dataplane_mode = ""
        self._startup_backoff = startup_backoff or Backoff(
            initial=STARTUP_RETRY_INITIAL_S, maximum=STARTUP_RETRY_MAX_S)
        self._health_server: HealthServer | None = None
        self._health_address: tuple[str, int, int, float] | None = None
        self._health: HealthAggregator | None = None

    @property
    def datastore(self) -> DatastoreLocation:
        """The datastore: --datastore, or (resolved at the start of `run`) Felix's settings."""
        if self.options.datastore is None:
            raise RuntimeError("the datastore is resolved at the start of run()")
        return self.options.datastore

    # --- lifecycle ------------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        self._stop.set()

    def load_config(self) -> Config:
        global_layer, node_layer = datastore_felix_config(self.datastore,
                                                          self.options.hostname)
        return load_config(environ=self.environ, config_file=self.options.config_file,
                           datastore_global=global_layer, datastore_node=node_layer)

    def local_config(self) -> Config:
        """The configuration without the datastore's layers (environment + config file):
        checked before anything else, and enough to serve health while the datastore is
        awaited."""
        return load_config(environ=self.environ, config_file=self.options.config_file)

    def wait_for_datastore_config(self, health: HealthAggregator) -> Config | None:
        """`load_config()`, retried with jittered exponential backoff for as long as the
        datastore cannot be reached (each failure logged with the delay before the next
        attempt; the `datastore` health reporter is not ready meanwhile). Returns None if
        the agent was asked to stop while waiting. A datastore that answers but refuses,
        or bad configuration in it, raises at once."""
        from pyfelix.agent.syncer.client import DatastoreUnavailable

        started = time.monotonic()
        while not self._stop.is_set():
            try:
                config = self.load_config()
            except DatastoreUnavailable as exc:
                health.report(DATASTORE_REPORTER, live=True, ready=False)
                delay = self._startup_backoff.failed()
                log.warning("datastore %s is not reachable (%s); waiting for it, next "
                            "attempt in %.1f s (attempt %d, %.0f s so far)",
                            self.datastore, exc, delay, self._startup_backoff.failures,
                            time.monotonic() - started)
                self._stop.wait(delay)
                continue
            if self._startup_backoff.failures:
                log.info("datastore %s reachable after %.1f s; starting",
                         self.datastore, time.monotonic() - started)
            health.report(DATASTORE_REPORTER, live=True, ready=True)
            return config
        return None

    def _status_reporter(self, config: Config, managers: list[Manager]) -> Any:
        """Felix's status reporting: a node record with a TTL in the datastore, and endpoint
        up/down/error records when EndpointReportingEnabled (its manager joins the loop)."""
        from pyfelix.agent.status import StatusReporter, open_status_store

        store = open_status_store(self.datastore, ttl=config.reporting_ttl_secs)
        if store is None:
            return None
        reporter = StatusReporter(store, self.options.hostname, ttl=config.reporting_ttl_secs,
                                  endpoint_reporting=config.endpoint_reporting_enabled)
        if config.endpoint_reporting_enabled:
            from pyfelix.agent.dataplane.managers.endpoint_status import EndpointStatusManager

            managers.append(EndpointStatusManager(reporter.on_endpoint_status))
        return reporter

    def _on_datastore_config(self, merged: dict[str, str]) -> None:
        """A FelixConfiguration changed: restart (exit 0) if any changed parameter needs it
        (Felix's rule, `Config.changed_requiring_restart`), else apply the live ones here
        (logging, health timeouts; the dataplane managers take DefaultEndpointToHostAction,
        the failsafe ports and BPFEnforceRPF from the ConfigUpdate itself). Bad values were
        logged, counted and skipped by load_config: the rest still applies."""
        assert self.config is not None
        new = load_config(environ=self.environ, config_file=self.options.config_file,
                          datastore_global=merged)
        changed = self.config.changed_requiring_restart(new)
        if changed:
            self._restart_reason = f"configuration changed: {', '.join(changed)}"
            self._stop.set()
            return
        self.apply_live(self.config, new)
        self.config = new

    def apply_live(self, old: Config, new: Config) -> list[str]:
        """Apply the live parameters that changed from `old` to `new`; returns their names."""
        from pyfelix.agent.logs import configure_logging

        changed = old.changed(new)
        if any(name in changed for name in LOGGING_PARAMS):
            configure_logging(log_sinks(new))
        if "HealthTimeoutOverrides" in changed and self._health is not None:
            self._health.apply_timeout_overrides(dict(new.health_timeout_overrides))
        note_not_implemented(new)
        for name in changed:
            log.info("configuration %s changed to %r; applied live", name, new.get(name))
        return changed

    def run(self) -> int:
        """Local configuration, health served from it, the datastore awaited (see
        `wait_for_datastore_config`), then the agent proper (`_run`)."""
        from pyfelix.agent.logs import configure_logging

        local = self.local_config()
        configure_logging(log_sinks(local))
        if self.options.datastore is None:
            self.options.datastore = resolve_felix_datastore(local, self.environ)
        health = HealthAggregator(timeout_overrides=dict(local.health_timeout_overrides))
        self._health = health
        health.register(DATASTORE_REPORTER, live=False, ready=True)
        health.register(DATAPLANE_REPORTER, live=False, ready=True)
        try:
            self._serve_health(health, local)
            config = self.wait_for_datastore_config(health)
            if config is None:
                log.info("stopped while waiting for the datastore")
                return EXIT_OK
            self.config = config
            configure_logging(log_sinks(config))
            note_not_implemented(config)
            self._serve_health(health, config)
            return self._run(config, health)
        finally:
            self._serve_health(health, None)

    def _serve_health(self, health: HealthAggregator, config: Config | None) -> None:
        """Serve health where `config` says (nowhere for None or HealthEnabled false),
        keeping the running server if it already listens there: the datastore's
        FelixConfiguration, read after the server started, may move or disable it."""
        wanted = None
        if config is not None and config.health_enabled:
            wanted = (config.health_host, config.health_port, config.health_max_connections,
                      config.health_read_timeout)
        if self._health_server is not None:
            if wanted == self._health_address:
                return
            self._health_server.stop()
            self._health_server = self._health_address = None
        if wanted is not None:
            host, port, max_connections, read_timeout = wanted
            server = HealthServer(health, host, port, max_connections=max_connections,
                                  read_timeout=read_timeout)
            server.start()
            self._health_server, self._health_address = server, wanted

    def _run(self, config: Config, health: HealthAggregator) -> int:
        from pyfelix.agent.dataplane.linux import LinuxDataplane, LinuxDataplaneConfig
        from pyfelix.agent.datastore import make_syncer

        mode, managers = self._managers_factory(config)
        self.dataplane_mode = mode
        reporter = self._status_reporter(config, managers)
        log.info("starting agent", extra={"fields": {
            "hostname": self.options.hostname, "datastore": str(self.datastore),
            "dataplane": mode}})

        # the datastore's layer may set HealthTimeoutOverrides: it counts from here on
        health.set_timeout_overrides(dict(config.health_timeout_overrides))
        calc_health = health.register("calc-graph", timeout=CALC_GRAPH_LIVENESS_TIMEOUT)
        dp_health = health.register(DATAPLANE_REPORTER,
                                    timeout=config.dataplane_watchdog_timeout)
        monitor_health = None
        if self._monitor_interfaces:
            monitor_health = health.register("iface-monitor", ready=False,
                                             timeout=IFACE_MONITOR_LIVENESS_TIMEOUT)
        for name in health.unknown_overrides():
            log.warning("HealthTimeoutOverrides: no health reporter is called %r", name)
        metrics_server = None
        if config.prometheus_metrics_enabled:
            metrics_server = metrics.serve_metrics(
                config.prometheus_metrics_host, config.prometheus_metrics_port,
                max_connections=config.prometheus_metrics_max_connections,
                read_timeout=config.prometheus_metrics_read_timeout)

        def dataplane_heartbeat() -> None:  # on the dataplane loop's thread
            dp_health.report(live=not loop.fatal.is_set(), ready=loop.in_sync.is_set())

        def calc_heartbeat() -> None:  # on the calc pipeline's thread
            calc_health.report(live=True, ready=pipeline.in_sync.is_set())

        dataplane = LinuxDataplane(
            managers=managers, resync_interval=config.route_refresh_interval,
            interface_refresh_interval=config.route_refresh_interval,
            config=LinuxDataplaneConfig.from_config(config, bpf_mode=mode == "bpf"),
            heartbeat=dataplane_heartbeat, heartbeat_interval=dp_health.interval,
            monitor_interfaces=monitor_health is not None,
            monitor_heartbeat=(None if monitor_health is None
                               else lambda: monitor_health.report(ready=False)))
        loop = dataplane.loop
        forwarder = _Forwarder(loop, self._on_datastore_config)
        pipeline = CalcPipeline(
            self.options.hostname, forwarder,
            on_batch=lambda seconds, _messages: metrics.CALC_GRAPH_UPDATE_TIME.observe(seconds),
            heartbeat=calc_heartbeat, heartbeat_interval=calc_health.interval)
        tap = _SyncerTap(pipeline)
        syncer = make_syncer(self.datastore, hostname=self.options.hostname)

        dataplane.loop.start()
        if reporter is not None:
            reporter.start()
        pipeline.start()
        syncer.start(tap)
        if dataplane.monitor is not None:  # interface state after the first datastore data
            dataplane.monitor.start()
        status = StatusWriter(config.status_file, self.options.hostname)
        gc_policy = GcPolicy()
        exit_code = EXIT_OK
        try:
            while not self._stop.wait(0.1):
                calc_ok = pipeline.in_sync.is_set()
                dp_ok = loop.in_sync.is_set()
                metrics.DATAPLANE_IN_SYNC.set(1 if dp_ok else 0)
                gc_policy.tick(time.monotonic(), in_sync=dp_ok)
                if reporter is not None:
                    reporter.set_in_sync(dp_ok)
                status.write(calc_in_sync=calc_ok, dataplane_in_sync=dp_ok,
                             endpoints=len(forwarder.endpoints),
                             policies=len(forwarder.policies),
                             last_update_wall=tap.last_update_wall,
                             idle=_idle(pipeline, loop), dataplane=mode,
                             rounds_applied=loop.rounds_applied,
                             failures=loop.consecutive_failures,
                             not_implemented=",".join(self.config.not_implemented()
                                                      if self.config else ()))
                if loop.fatal.is_set():
                    log.critical("dataplane failed closed: %s; exiting", loop.fatal_reason)
                    exit_code = EXIT_FATAL
                    break
                if _syncer_gave_up(syncer):
                    log.critical("datastore connection failed for good (%s); exiting",
                                 self.datastore)
                    exit_code = EXIT_FATAL
                    break
                if not pipeline.is_alive():
                    log.critical("calculation graph thread died (%r); exiting", pipeline.failure)
                    exit_code = EXIT_FATAL
                    break
            if self._restart_reason:
                log.warning("%s; exiting so the agent restarts with it", self._restart_reason)
        finally:
            log.info("stopping; the programmed dataplane stays in place")
            syncer.stop()
            pipeline.stop()
            dataplane.stop()  # monitor, loop, then every manager's close()
            if reporter is not None:
                reporter.stop(clean=True)
            if metrics_server is not None:
                metrics_server.stop()
        return exit_code


def _syncer_gave_up(syncer: Any) -> bool:
    """A syncer that stops retrying (Typha's client after its connection attempts) sets a
    `failed` event; the agent then exits non-zero, as Felix does when Typha is gone."""
    failed = getattr(syncer, "failed", None)
    return failed is not None and failed.is_set()


def _idle(pipeline: CalcPipeline, loop: DataplaneLoop) -> bool:
    """Nothing left to do: the calc graph has no input, and everything it sent is in the
    kernel (`DataplaneLoop.settled`: a queue drained into an apply round still running is
    not idle; the lab probes only once the status file says idle)."""
    return (pipeline.idle() and loop.settled() and loop.consecutive_failures == 0
            and loop.in_sync.is_set())


class StatusWriter:
    """Writes the agent's sync/apply status as JSON when it changes.

    The file is replaced atomically through a temporary file of a random name created with
    O_EXCL|O_NOFOLLOW beside it (`agent.atomic_file`): a symlink planted at a temporary name
    or at the status file's own name never makes the agent write anywhere else. A failed
    write is logged (once per distinct error) and retried on the next call; it never stops
    the agent."""

    def __init__(self, path: str, hostname: str) -> None:
        self._path = Path(path) if path else None
        self._hostname = hostname
        self._last: dict[str, Any] | None = None
        self._last_error = ""

    def write(self, **fields: Any) -> None:
        if self._path is None or fields == self._last:
            return
        body = {"hostname": self._hostname, "pid": os.getpid(), "written_wall": time.time(),
                **fields}
        try:
            write_atomically(self._path, json.dumps(body, sort_keys=True).encode())
        except OSError as exc:
            if str(exc) != self._last_error:
                log.warning("cannot write the status file %s: %s", self._path, exc)
            self._last_error = str(exc)
            return
        self._last_error = ""
        self._last = dict(fields)


def run_agent(options: AgentOptions, *, install_signals: bool = True) -> int:
    agent = Agent(options)
    if install_signals:
        signal.signal(signal.SIGTERM, agent.request_stop)
        signal.signal(signal.SIGINT, agent.request_stop)
    return agent.run()
