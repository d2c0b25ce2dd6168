"""Option types shared by the commands: where command-line text becomes pyfelix values.

`DATASTORE` is the one place a `--datastore` value (or PYFELIX_DATASTORE) is parsed: click
converts it with `agent.datastore.parse_datastore_url` before the command runs, so every
command receives a `DatastoreLocation` and a bad value is a usage error naming the option
and the accepted forms (exit status 2), never a traceback.
"""

from __future__ import annotations

from typing import Any

import click

from pyfelix.agent.datastore import DatastoreLocation, parse_datastore_url
from pyfelix.agent.syncer.client import DatastoreURLError

DATASTORE_HELP = ("Directory or YAML file, etcd3://HOST:PORT[,...], kubernetes, or "
                  "typha://HOST:PORT[,...]. Env: PYFELIX_DATASTORE.")


class DatastoreParam(click.ParamType):
    name = "URL"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> DatastoreLocation:
        if isinstance(value, DatastoreLocation):
            return value
        try:
            return parse_datastore_url(str(value))
        except DatastoreURLError as exc:
            self.fail(str(exc), param, ctx)


DATASTORE = DatastoreParam()
