"""`pyfelix bpf <map> dump [-o json] [--pin-dir DIR]`: print a pinned BPF map;
`pyfelix bpf summary`: how full every pinned map is (entries / max_entries).

Adds no logic: `agent.bpf.maps.dump_pinned` opens the pin with raw bpf() syscalls (no BCC,
no compile) and returns JSON-ready rows, sorted; this module formats them as a table (nested
values as compact JSON) or as a JSON list. The pin directory defaults to FELIX_BPFPINDIR,
else /sys/fs/bpf/pyfelix (the agent's BPFPinDir).
"""

from __future__ import annotations

import json
from typing import Any

import click

from pyfelix.agent.bpf.maps import BY_NAME
from pyfelix.cli.params import DATASTORE

DEFAULT_PIN_DIR = "/sys/fs/bpf/pyfelix"

MAP_HELP = {
    "ipsets": "IP-set members (LPM trie: set id + prefix [+ proto:port]).",
    "ids": "Names of the numeric ids (IP sets, net sets, rule counters, endpoints).",
    "rules": "Policy rule records (chains) in the rules array.",
    "endpoints": "Workload interfaces (ifindex) -> endpoint id and chains.",
    "ep_by_ifindex": "Array mirror of endpoints for small ifindexes (the fast lookup).",
    "conntrack": "Tracked flows per interface, with expiry.",
    "rule_counters": "Packets/bytes per rule counter (non-zero only).",
    "ep_counters": "Allowed/denied packets/bytes per endpoint (non-zero only).",
    "ep_spoofed": "Packets/bytes each endpoint sent from a source it may not use (dropped).",
    "global_counters": "Why packets took their path (conntrack hits, drops, ...).",
    "routes": "Destination prefixes -> flags (local host, workload, pool), ifindex.",
    "config": "Dataplane settings the programs read (endpoint-to-host action).",
    "untracked": "XDP early-drop prefixes (untracked deny rules of host endpoints).",
    "wep_sources": "Source prefixes each workload interface may send from (RPF).",
    "nat_frontend": "Service frontends (VIP, port, protocol) -> service id, backend count.",
    "nat_backend": "Service backends by (service id, index).",
    "nat_affinity": "ClientIP session affinity: (service id, client) -> backend.",
    "nat_ct": "Each service flow's translation (fwd: client -> backend, rev: reply -> VIP).",
    "nat_counters": "What the service NAT did (new flows, replies, rejects, failures).",
    "ctlb_rev": "Host sockets sent to a service backend at connect time -> the VIP they asked.",
    "denied_sources": "Packets/bytes policy denied per (deciding rule counter, source address).",
    "verdict_trace": "The policy decision of the last pyfelix explain packet (BPF_PROG_TEST_RUN).",
    "cls_chains": "Policy chain start -> its classifier instance (0: none, packets dropped).",
    "cls_words": "Classifier instances' blocks: header and rule bitvectors (sizes shown).",
    "cls_tries": "Classifier LPM lookups per instance: addresses, named ports, ports -> vector.",
    "cls_l4": "Classifier protocol / ICMP type and code lookups per instance -> vector.",
    "nat_vip_filter": "One bit per hashed service VIP: non-VIP packets skip the NAT lookup.",
    "nat_frontend6": "IPv6 service frontends: (VIP, port, protocol) -> service id, count.",
    "nat_backend6": "IPv6 service backends: (service id, index) -> backend address:port.",
    "nat_affinity6": "IPv6 ClientIP session affinity: (service id, client) -> backend.",
    "nat_ct6": "Each IPv6 service flow's translation (fwd: client -> backend, rev: -> VIP).",
}


def _cell(value: Any) -> str:
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    """Rows as an aligned text table; columns in first-seen order."""
    if not rows:
        return "(no entries)"
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    cells = [[c.upper() for c in columns]]
    cells += [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def _resolved(pin_dir: str) -> str:
    from pyfelix.agent.bpf.loader import LoaderError, resolve_pin_dir

    try:
        return str(resolve_pin_dir(pin_dir, mount=False))
    except LoaderError as exc:
        raise click.ClickException(f"{exc} (set --pin-dir or FELIX_BPFPINDIR)") from exc


def read_rows(map_name: str, pin_dir: str) -> list[dict[str, Any]]:
    """The library call behind `dump` (raises click errors with the pin path named)."""
    from pyfelix.agent.bpf.maps import conntrack as ct_map
    from pyfelix.agent.bpf.maps import dump_pinned
    from pyfelix.agent.bpf.maps.base import BpfMap

    path = _resolved(pin_dir)
    try:
        if map_name == "conntrack":
            with BpfMap.open_pinned(ct_map.PARAMS, path) as m:
                return ct_map.dump(m, now_ns=ct_map.now_ns())
        rows = dump_pinned(map_name, path)
        if map_name == "global_counters":
            from pyfelix.agent.shims.nft_guard import guard_counter_rows

            rows += guard_counter_rows()
        return rows
    except OSError as exc:
        raise click.ClickException(
            f"BPF map {map_name!r} is not readable under {pin_dir}: {exc} (is an agent "
            f"running with BPFPinDir={pin_dir}?)") from exc


_output_option = click.option("-o", "--output", type=click.Choice(["table", "json"]),
                              default="table", show_default=True)
_pin_dir_option = click.option("--pin-dir", envvar="FELIX_BPFPINDIR", default=DEFAULT_PIN_DIR,
                               show_default=True, metavar="DIR",
                               help="bpffs directory the agent pins under. "
                                    "Env: FELIX_BPFPINDIR.")


def _dump_command(map_name: str) -> click.Command:
    @click.command("dump")
    @_output_option
    @_pin_dir_option
    def dump(output: str, pin_dir: str) -> None:
        rows = read_rows(map_name, pin_dir)
        if output == "json":
            click.echo(json.dumps(rows, indent=2, sort_keys=True))
        else:
            click.echo(table(rows))

    dump.help = (f"Print the pinned {map_name!r} map (sorted).\n\n"
                 f"\b\nExamples:\n  pyfelix bpf {map_name} dump\n"
                 f"  pyfelix bpf {map_name} dump -o json --pin-dir /sys/fs/bpf/pyfelix")
    return dump


def _map_group(map_name: str) -> click.Group:
    group = click.Group(map_name, help=MAP_HELP.get(map_name, f"The {map_name} map."))
    group.add_command(_dump_command(map_name))
    return group


@click.group("bpf", context_settings={"help_option_names": ["-h", "--help"]})
def command() -> None:
    """Dump the pinned BPF maps (read directly from bpffs; no compile, no agent needed).

    \b
    Examples:
      pyfelix bpf endpoints dump
      pyfelix bpf ipsets dump -o json
      pyfelix bpf conntrack dump --pin-dir /sys/fs/bpf/pyfelix
      FELIX_BPFPINDIR=/sys/fs/bpf/pyfelix pyfelix bpf global_counters dump
      pyfelix bpf nat dump
      pyfelix bpf summary
      pyfelix bpf cleanup
    """


@command.command("cleanup")
@_pin_dir_option
def cleanup(pin_dir: str) -> None:
    """Remove pyfelix's BPF dataplane from this network namespace: our tc filters and XDP
    programs, the guard table that drops traffic of unprogrammed workload interfaces, and
    our pins under --pin-dir. For uninstalling, or leaving BPF mode by hand: a stopped agent
    leaves all of it in place on purpose (programs keep enforcing, the guard keeps new
    interfaces closed). Exits 1 if anything could not be removed.

    \b
    Examples:
      pyfelix bpf cleanup
      ip netns exec NODE pyfelix bpf cleanup --pin-dir /sys/fs/bpf/mynode
    """
    from pyfelix.agent.dataplane.managers.bpf_cleanup import BpfCleanupManager
    from pyfelix.agent.proto import InSync
    from pyfelix.agent.shims.nft_guard import NftGuard

    manager = BpfCleanupManager(pin_dir, remove_guard=NftGuard().remove, retry_initial=0.0)
    manager.on_update(InSync())
    manager.finish_apply()
    result = manager.last
    if not manager.sweeps or result is None:
        raise click.ClickException("BPF cleanup failed; see the log lines above")
    click.echo(f"removed {result.tc_filters} tc filter(s), {result.xdp_programs} XDP "
               f"program(s), guard table: {'yes' if result.guard else 'none'}, "
               f"{result.pins} pin(s)")


@command.group("nat")
def nat_group() -> None:
    """Services (the kube-proxy replacement): frontends, backends, affinity, counters."""


@nat_group.command("dump")
@_output_option
@_pin_dir_option
def nat_dump(output: str, pin_dir: str) -> None:
    """Every service frontend (VIP:port/protocol) with its backends in index order and its
    ClientIP affinity entries, then the NAT counters.

    \b
    Examples:
      pyfelix bpf nat dump
      pyfelix bpf nat dump -o json --pin-dir /sys/fs/bpf/pyfelix
    """
    from pyfelix.agent.bpf.maps import nat_pinned

    path = _resolved(pin_dir)
    try:
        view = nat_pinned(path)
    except OSError as exc:
        raise click.ClickException(f"the service NAT maps are not readable under {pin_dir}: "
                                   f"{exc} (is an agent running with BPFPinDir={pin_dir}?)"
                                   ) from exc
    if output == "json":
        click.echo(json.dumps(view, indent=2, sort_keys=True))
        return
    click.echo(table([{**f, "affinity": len(f["affinity"])} for f in view["frontends"]]))
    click.echo("")
    click.echo(table([{"counter": k, "value": v} for k, v in view["counters"].items()]))


@command.command("summary")
@_output_option
@_pin_dir_option
def summary(output: str, pin_dir: str) -> None:
    """How full each pinned map is: entries, max_entries, fill %.

    Entries are keys for hash, LRU and LPM-trie maps (a snapshot: approximate while traffic
    creates flows) and, for the rules array, the records of the chains the endpoints use;
    the other arrays show none (every slot always exists). A map that is not pinned, not
    readable or of another layout is listed with the reason, and the command exits 1.

    \b
    Examples:
      pyfelix bpf summary
      pyfelix bpf summary -o json --pin-dir /sys/fs/bpf/pyfelix
    """
    from pyfelix.agent.bpf.maps import summary_pinned

    rows = summary_pinned(_resolved(pin_dir))
    if output == "json":
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
    else:
        click.echo(table([_summary_cells(row) for row in rows]))
        try:
            from pyfelix.agent.bpf.maps import nat_summary_pinned

            nat = nat_summary_pinned(_resolved(pin_dir))
            click.echo(f"\nservices: {nat['frontends']} frontends "
                       f"({nat['frontends_without_backends']} without backends: rejected), "
                       f"{nat['backends']} backends, {nat['nat_flows']} NAT flows")
        except OSError:
            pass  # the NAT maps' rows above already say why
    failed = [row["map"] for row in rows if "error" in row]
    if failed:
        raise click.ClickException(f"not readable under {pin_dir}: {', '.join(failed)}")


def _summary_cells(row: dict[str, Any]) -> dict[str, Any]:
    """A summary row for the table: "-" where a figure does not apply (counter arrays)."""
    if "error" in row:
        return row
    return {**row, **{k: "-" for k in ("entries", "fill_pct") if row[k] is None}}


def rule_rows(pin_dir: str, catalogue: dict[str, dict[str, Any]] | None) -> list[dict[str, Any]]:
    """`pyfelix bpf rules dump`: one row per rule counter, the rule named from `catalogue`
    (`agent.calc.explain.rule_catalogue`: policy, tier, direction, index, the rule as
    written) when given, with its packets/bytes and its records' count."""
    from pyfelix.agent.bpf.maps import rules_by_counter_pinned

    try:
        counters = rules_by_counter_pinned(_resolved(pin_dir))
    except OSError as exc:
        raise click.ClickException(f"the rule maps are not readable under {pin_dir}: {exc} "
                                   f"(is an agent running with BPFPinDir={pin_dir}?)") from exc
    rows = []
    for c in counters:
        name = c["name"]
        meta = (catalogue or {}).get(name)
        row: dict[str, Any] = {"policy": None, "tier": None, "direction": None, "rule": None,
                               "action": None, "match": None}
        if meta is not None:
            row.update({k: meta[k] for k in row})
            if meta["kind"] == "profile":
                row["policy"] = f"profile:{meta['policy']}"
        elif name.startswith("tier-end:"):
            tier, _, direction = name[len("tier-end:"):].rpartition("/")
            row.update(tier=tier, direction=direction, action="deny",
                       match="end of tier: no policy of the tier matched")
        elif name.startswith("default-deny/"):
            row.update(direction=name.split("/", 1)[1], action="deny",
                       match="no tier or profile allowed it")
        else:
            row["match"] = c["records"] or None  # no datastore: the records, sets named
            row["action"] = c["records"][0]["action"] if c["records"] else None
        row.update(packets=c["packets"], bytes=c["bytes"], records=len(c["records"]),
                   counter=name)
        rows.append(row)
    order = {"ingress": 0, "egress": 1, None: 2}
    return sorted(rows, key=lambda r: (r["policy"] is None, str(r["tier"] or ""),
                                       str(r["policy"] or ""), order.get(r["direction"], 2),
                                       r["rule"] if r["rule"] is not None else 1 << 30,
                                       r["counter"]))


@click.group("rules")
def rules_group() -> None:
    """Policy rules as programmed: per rule its policy, tier, index, match and counters."""


@rules_group.command("dump")
@_output_option
@_pin_dir_option
@click.option("--datastore", type=DATASTORE, envvar="PYFELIX_DATASTORE", default=None,
              help="The agent's datastore: names each counter's policy, tier, rule index and "
                   "the rule as written. Without it, the records (IP sets by name).")
@click.option("--hostname", envvar="NODENAME", default=None, metavar="NODE",
              help="This node's name, as the agent's. Env: NODENAME.")
@click.option("--records", is_flag=True, help="Print the raw records instead (old view).")
def rules_dump(output: str, pin_dir: str, datastore: Any, hostname: str | None,
               records: bool) -> None:
    """Each rule of the policies and profiles this node programs, with its policy, tier,
    direction, rule index, the rule as written (selectors, not IP-set ids) and its packet
    and byte counters (packets the rule decided: allow, deny, pass or log), plus the
    end-of-tier and final denies.

    \b
    Examples:
      pyfelix bpf rules dump --datastore /etc/pyfelix/resources --hostname node1
      pyfelix bpf rules dump -o json
      pyfelix bpf rules dump --records
    """
    if records:
        rows = read_rows("rules", pin_dir)
    else:
        catalogue = None
        if datastore is not None and hostname:
            from pyfelix.agent.calc.explain import compute_model, rule_catalogue

            catalogue = rule_catalogue(compute_model(datastore, hostname))
        else:
            click.echo("note: no --datastore/--hostname: rules are shown by their records",
                       err=True)
        rows = rule_rows(pin_dir, catalogue)
    if output == "json":
        click.echo(json.dumps(rows, indent=2, sort_keys=True))
    else:
        click.echo(table(rows))


for _name in sorted(BY_NAME):
    if _name == "rules":
        command.add_command(rules_group)
        continue
    command.add_command(_map_group(_name))
