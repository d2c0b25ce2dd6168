"""Render a `BirdConfig` into BIRD 2 configuration text with jinja2.

Role: printing only. Every decision is already in the `BirdConfig` (see `bgp_config`); the
templates under `confd/templates/` loop and test flags, nothing else.

Input: a `BirdConfig`. Output: the text of bird.conf (deterministic: the same config always
renders byte-identical text, which the watcher relies on to skip needless reloads and the
golden tests rely on to compare).

Invariant: `StrictUndefined`, so a template naming a field the model lacks fails loudly
instead of printing an empty string into the routing configuration.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

import jinja2

from pyfelix.agent.syncer.api import RawUpdate
from pyfelix.confd.bgp_config import DEFAULT_INTERFACE_PREFIX, BirdConfig, compute_bird_config
from pyfelix.confd.bgp_view import state_from_updates

TEMPLATE_NAME = "bird.conf.j2"


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("pyfelix.confd", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # BIRD syntax, not HTML
    )


def render_bird_config(config: BirdConfig) -> str:
    """The bird.conf text for `config`."""
    return _environment().get_template(TEMPLATE_NAME).render(c=config)


def render_from_updates(updates: Iterable[RawUpdate], hostname: str, *,
                        interface_prefix: str = DEFAULT_INTERFACE_PREFIX,
                        secret_namespace: str | None = None,
                        ) -> tuple[str, BirdConfig]:
    """One-shot: datastore updates -> (bird.conf text, the model it was printed from).

    Resources that fail validation are skipped and listed in the model's `notes` (rendered
    as comments). Secrets are read from `secret_namespace` (default: $NAMESPACE, else
    kube-system). Raises `ConfdError` when this node cannot have a config.
    """
    state, problems = state_from_updates(updates, secret_namespace=secret_namespace)
    config = compute_bird_config(state, hostname, interface_prefix=interface_prefix,
                                 problems=problems)
    return render_bird_config(config), config
