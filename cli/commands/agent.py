"""`pyfelix agent`: run the node agent (datastore -> calc graph -> dataplane) until SIGTERM."""

from __future__ import annotations

import sys

import click

from pyfelix.agent.datastore import DatastoreLocation
from pyfelix.cli.params import DATASTORE


@click.command("agent")
@click.option("--datastore", type=DATASTORE, envvar="PYFELIX_DATASTORE", default=None,
              help="Directory/YAML file, etcd3://HOST:PORT[,...], kubernetes, or typha://... "
                   "Default: as Felix, from DatastoreType, EtcdEndpoints/EtcdAddr and "
                   "TyphaAddr/TyphaK8sServiceName (FELIX_* environment or config file).")
@click.option("--hostname", envvar="NODENAME", required=True,
              help="This node's name (as in WorkloadEndpoint spec.node / Pod nodeName).")
@click.option("--config-file", type=click.Path(dir_okay=False), default=None,
              help="Felix-style config file (INI [global] section, or YAML mapping).")
def command(datastore: DatastoreLocation | None, hostname: str, config_file: str | None) -> None:
    """Run the node agent in the current network namespace.

    Every other setting comes, as Felix names it, from FELIX_<NAME> environment variables,
    the config file, and FelixConfiguration resources (`default`, then `node.<hostname>`).
    Exit status: 0 after SIGTERM/SIGINT or a restart-requiring config change, 1 when the
    dataplane cannot be programmed (fail closed), 2 for bad configuration.

    \b
    Examples:
      pyfelix agent --datastore /etc/pyfelix/resources --hostname node1
      FELIX_BPFENABLED=false pyfelix agent --datastore etcd3://127.0.0.1:2379 --hostname n1
      FELIX_DATASTORETYPE=etcdv3 FELIX_ETCDENDPOINTS=http://10.0.0.1:2379 \
        pyfelix agent --hostname n1
    """
    from pyfelix.agent.config import ConfigError
    from pyfelix.agent.daemon import EXIT_CONFIG, AgentOptions, DataplaneUnavailable, run_agent
    from pyfelix.agent.syncer.client import DatastoreClientError

    try:
        code = run_agent(AgentOptions(datastore=datastore, hostname=hostname,
                                      config_file=config_file))
    except ConfigError as exc:
        click.echo(f"pyfelix agent: bad configuration: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except DatastoreClientError as exc:
        click.echo(f"pyfelix agent: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except DataplaneUnavailable as exc:
        click.echo(f"pyfelix agent: {exc}. Set FELIX_BPFFALLBACK=iptables to fall back, or "
                   "FELIX_BPFENABLED=false.", err=True)
        sys.exit(1)
    sys.exit(code)
