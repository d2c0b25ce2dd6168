"""`pyfelix typha`: serve one datastore watch per syncer type to many agents and confds.

Adds no logic: parses options into `agent.typha.server.ServerConfig`, starts a
`TyphaServer` (one syncer per syncer type from `agent.datastore.make_syncer`), serves
metrics if asked, and runs until SIGTERM / Ctrl-C. Settings also come from Calico Typha's
environment variables (TYPHA_CAFILE, TYPHA_SERVERCERTFILE, TYPHA_HEALTHENABLED, ...), as
deploy/typha/ sets them; the pending-handshake limit is named in the same style
(TYPHA_SERVERMAXPENDINGHANDSHAKES).
"""

from __future__ import annotations

import click

from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.agent.typha.server import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_HEALTH_PORT,
    DEFAULT_MAX_PENDING_HANDSHAKES,
)
from pyfelix.cli.params import DATASTORE

SECURITY_HELP = (
    "refusing to start: give TLS settings (--ca-file, --cert-file, --key-file and "
    "--client-cn and/or --client-uri-san; clients must present a certificate signed by the "
    "CA carrying that identity), or --insecure to serve plain TCP on a trusted network")


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise click.BadParameter(f"{text!r} is not HOST:PORT (port 0-65535; 0 picks a free "
                                 "one)", param_hint="--listen")
    return host, int(port)


@click.command("typha")
@click.option("--datastore", type=DATASTORE, envvar="PYFELIX_DATASTORE", required=True,
              help="A directory or YAML file (file datastore), etcd3://HOST:PORT[,...] or "
                   "kubernetes. Env: PYFELIX_DATASTORE.")
@click.option("--listen", metavar="HOST:PORT", required=True, envvar="TYPHA_LISTEN",
              help="Address to serve clients on, e.g. 0.0.0.0:5473. Env: TYPHA_LISTEN.")
@click.option("--insecure", is_flag=True,
              help="Serve plain TCP without TLS (only on a trusted network).")
@click.option("--ca-file", envvar="TYPHA_CAFILE", metavar="PATH",
              help="CA certificate(s) that sign client certificates. Env: TYPHA_CAFILE.")
@click.option("--cert-file", envvar="TYPHA_SERVERCERTFILE", metavar="PATH",
              help="This server's certificate. Env: TYPHA_SERVERCERTFILE.")
@click.option("--key-file", envvar="TYPHA_SERVERKEYFILE", metavar="PATH",
              help="This server's private key. Env: TYPHA_SERVERKEYFILE.")
@click.option("--client-cn", envvar="TYPHA_CLIENTCN", metavar="CN",
              help="Accept clients whose certificate has this common name. Env: "
                   "TYPHA_CLIENTCN.")
@click.option("--client-uri-san", envvar="TYPHA_CLIENTURISAN", metavar="URI",
              help="Accept clients whose certificate has this URI SAN. Env: TYPHA_CLIENTURISAN.")
@click.option("--syncer-types", default="felix,bgp", show_default=True, metavar="LIST",
              help="Syncer types to serve (felix: every kind, for agents and calc; bgp: what "
                   "confd reads). One datastore syncer runs per type.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              envvar="TYPHA_PROMETHEUSMETRICSPORT",
              help="Serve Prometheus metrics on this port (0: do not). Env: "
                   "TYPHA_PROMETHEUSMETRICSPORT.")
@click.option("--metrics-host", default="0.0.0.0", show_default=True,
              help="Address for the metrics endpoint.")
@click.option("--ping-interval", type=click.FloatRange(min=0.01), default=10.0,
              show_default=True, help="Seconds between pings to each client.")
@click.option("--pong-timeout", type=click.FloatRange(min=0.02), default=60.0,
              show_default=True, help="Drop a client that sends no pong for this long.")
@click.option("--write-timeout", type=click.FloatRange(min=0.01), default=30.0,
              show_default=True, help="Drop a client that does not take queued data for "
                                      "this long (a slow client).")
@click.option("--batch-delay", type=click.FloatRange(0.0, 1.0), default=0.1,
              show_default=True, help="Seconds an update may wait to share a write with the "
                                      "updates after it (fewer, bigger writes per client).")
@click.option("--max-connections", type=click.IntRange(min=1), default=10_000,
              show_default=True, envvar="TYPHA_MAXCONNECTIONSUPPERLIMIT",
              help="Refuse clients beyond this many. Env: TYPHA_MAXCONNECTIONSUPPERLIMIT.")
@click.option("--handshake-timeout", type=click.FloatRange(min=0.01),
              default=DEFAULT_HANDSHAKE_TIMEOUT, show_default=True,
              envvar="TYPHA_SERVERHANDSHAKETIMEOUTSECS",
              help="Seconds a new connection has for its TLS handshake and client hello "
                   "together; then it is dropped. Env: TYPHA_SERVERHANDSHAKETIMEOUTSECS.")
@click.option("--max-pending-handshakes", type=click.IntRange(min=1),
              default=DEFAULT_MAX_PENDING_HANDSHAKES, show_default=True,
              envvar="TYPHA_SERVERMAXPENDINGHANDSHAKES",
              help="Connections that have not completed their hello yet, at most; more are "
                   "refused at once (typha_connections_dropped{reason=\"pending-limit\"}). "
                   "Env: TYPHA_SERVERMAXPENDINGHANDSHAKES.")
@click.option("--health-enabled", is_flag=True, envvar="TYPHA_HEALTHENABLED",
              help="Serve /liveness and /readiness over HTTP (ready = every syncer in sync "
                   "with the datastore). Env: TYPHA_HEALTHENABLED.")
@click.option("--health-port", type=click.IntRange(0, 65535), default=DEFAULT_HEALTH_PORT,
              show_default=True, envvar="TYPHA_HEALTHPORT",
              help="Port of the health endpoints. Env: TYPHA_HEALTHPORT.")
@click.option("--health-host", default="localhost", show_default=True,
              envvar="TYPHA_HEALTHHOST",
              help="Address of the health endpoints. Env: TYPHA_HEALTHHOST.")
@click.option("--log-severity", envvar="TYPHA_LOGSEVERITYSCREEN", default="Info",
              show_default=True, type=click.Choice(["Debug", "Info", "Warning", "Error"]),
              help="Log level. Env: TYPHA_LOGSEVERITYSCREEN.")
def command(datastore: DatastoreLocation, listen: str, insecure: bool, ca_file: str | None,
            cert_file: str | None, key_file: str | None, client_cn: str | None,
            client_uri_san: str | None, syncer_types: str, metrics_port: int,
            metrics_host: str, ping_interval: float, pong_timeout: float,
            write_timeout: float, batch_delay: float, max_connections: int,
            handshake_timeout: float, max_pending_handshakes: int, health_enabled: bool,
            health_port: int, health_host: str, log_severity: str) -> None:
    """Serve one datastore watch per syncer type to many agents and confds (fan-out).

    Agents and `pyfelix calc` connect with --datastore typha://HOST:PORT (syncer type
    felix), confd with the bgp syncer type. Each client gets a snapshot, then deltas; a
    client too slow to keep up is disconnected and gets a fresh snapshot when it returns.
    The wire protocol is described in docs/typha-protocol.md.

    \b
    Examples:
      pyfelix typha --datastore ./resources --listen 127.0.0.1:5473 --insecure
      pyfelix typha --datastore kubernetes --listen 0.0.0.0:5473 \\
          --ca-file ca.crt --cert-file typha.crt --key-file typha.key \\
          --client-cn pyfelix-node --metrics-port 9093
    """
    from pyfelix.agent.datastore import make_syncer
    from pyfelix.agent.logs import configure_logging
    from pyfelix.agent.syncer.client import DatastoreClientError
    from pyfelix.agent.typha.daemon import TyphaStartError, run
    from pyfelix.agent.typha.server import ServerConfig
    from pyfelix.agent.typha.tls import ServerTLS, TLSConfigError

    host, port = _listen_address(listen)
    tls_given = any((ca_file, cert_file, key_file, client_cn, client_uri_san))
    if insecure and tls_given:
        raise click.UsageError("--insecure cannot be combined with TLS options (--ca-file, "
                               "--cert-file, --key-file, --client-cn, --client-uri-san)")
    if not insecure and not tls_given:
        raise click.UsageError(SECURITY_HELP)
    tls = None
    if not insecure:
        tls = ServerTLS(ca_file or "", cert_file or "", key_file or "", client_cn,
                        client_uri_san)
        try:
            tls.validate()
        except TLSConfigError as exc:
            raise click.UsageError(str(exc)) from exc
    if datastore.backend == "typha":
        raise click.UsageError("--datastore cannot be another Typha (typha://)")
    types = tuple(t.strip() for t in syncer_types.split(",") if t.strip())
    try:
        config = ServerConfig(host=host, port=port, tls=tls, syncer_types=types,
                              ping_interval=ping_interval, pong_timeout=pong_timeout,
                              write_timeout=write_timeout, batch_delay=batch_delay,
                              max_connections=max_connections,
                              handshake_timeout=handshake_timeout,
                              max_pending_handshakes=max_pending_handshakes,
                              health_port=health_port if health_enabled else None,
                              health_host=health_host)
        config.validate()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc

    configure_logging(log_severity)

    def started(bound_host: str, bound_port: int) -> None:
        click.echo(f"typha: serving {', '.join(types)} from {datastore} on "
                   f"{bound_host}:{bound_port} ({'TLS' if tls else 'plain TCP'})", err=True)

    try:
        run(config, lambda syncer_type: make_syncer(datastore, syncer_type=syncer_type),
            start_errors=(DatastoreClientError,), metrics_port=metrics_port,
            metrics_host=metrics_host, on_started=started)
    except TyphaStartError as exc:
        raise click.ClickException(str(exc)) from exc
