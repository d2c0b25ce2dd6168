"""BPF NAT manager: the service maps (`nat_frontend`, `nat_backend`, `nat_affinity`) by
difference: the kube-proxy replacement's control side.

Role (Felix's BPF NAT syncer). Inputs (`on_update`, cheap): ServiceFrontendUpdate/Remove
(agent/calc/services.py) and InSync. The programs (bpf/include/nat.h) DNAT pods' traffic to
a frontend's backends and keep each flow's translation in `nat_ct`.

`apply()`:
- on the first apply and at a resync, read `nat_frontend` and `nat_backend`; a frontend's
  service id is adopted from the pinned entry, so a restarted agent keeps every id (the
  `nat_ct` and `nat_affinity` entries of live flows stay meaningful); new frontends get
  the smallest free id (ids are never 0);
- desired contents: per frontend, its entry (service id, backend count, flags, affinity
  timeout, and a copy of its first `fe_map.INLINE_BACKENDS` backends, from which the
  programs pick most new flows' backend without a `nat_backend` lookup) and its backends
  at indexes [0, n) in the message's (sorted) order;
- `nat_vip_filter` (the programs' cheap "may this be a VIP?" check) gets the bits of every
  frontend present or about to be written FIRST, and loses those of removed frontends only
  LAST, so a live frontend's bit is never clear;
- writes, in make-before-break order: backends that differ, then frontends that differ
  (a grown frontend's new indexes exist before its count says so), then stale backends and
  frontends (a shrunk frontend's count is lowered before its last indexes go). Stale
  entries of frontends this run never heard of are deleted only after InSync (before it,
  the datastore may not have told us everything: never delete on partial information);
- a frontend's changed backends touch only that frontend's keys; flows already running
  keep their backend through `nat_ct` (a backend that stays is not disturbed; one that
  goes gets no new flows);
- `nat_affinity`: when a frontend loses backends (or goes), the affinity entries of its
  service id that point at a backend no longer present are deleted, so affinity never
  holds a client to a removed backend; at a (re)sync, entries of service ids no pinned
  frontend has are deleted (a replaced `nat_frontend` gives its ids out afresh).
The same state twice writes nothing.

Families: one manager per IP family, as Calico's BPF mode keeps separate v4 and v6 NAT
maps. `family=4` (the default) writes `nat_frontend`/`nat_backend`/`nat_affinity` and the
VIP filter and takes only frontends with an IPv4 VIP (NodePorts: `proto.NODEPORT_VIP`);
`family=6` writes `nat_frontend6`/`nat_backend6`/`nat_affinity6` (no VIP filter: pass None)
and takes only frontends with an IPv6 VIP (NodePorts: `proto.NODEPORT_VIP6`, key `[::]`).
Each ignores the other family's messages, so both can be fed the same stream; their service
ids are separate key spaces.

Failure (fail closed): a frontend whose backends do not all fit in `nat_backend` is
written with count 0 (its traffic is rejected, never sent to a missing index) and logged;
a frontend that does not fit in `nat_frontend` is left out (its traffic is not translated:
the ClusterIP is not routed anywhere); both are counted in
`pyfelix_bpf_map_full_errors_total{map}` and retried at the next change or resync.
Other errors raise (the loop retries), and the mirrors are re-read first.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from pyfelix.agent import proto
from pyfelix.agent.bpf.maps import nat_affinity as aff_map
from pyfelix.agent.bpf.maps import nat_affinity6, nat_backend6, nat_frontend6
from pyfelix.agent.bpf.maps import nat_backend as be_map
from pyfelix.agent.bpf.maps import nat_frontend as fe_map
from pyfelix.agent.bpf.maps import nat_vip_filter as filter_map
from pyfelix.agent.dataplane.manager import ManagerBase
from pyfelix.agent.dataplane.managers import bpf_metrics as metrics
from pyfelix.agent.dataplane.managers.bpf_mirror import MapMirror

log = logging.getLogger(__name__)


def frontend_key(msg: proto.ServiceFrontendUpdate) -> bytes:
    """The key of `msg` in its family's frontend map."""
    return map_modules(vip_family(msg.vip))[0].encode_key(msg.vip, msg.port, msg.protocol)


def vip_family(vip: str) -> int:
    """4 or 6: the family of a frontend's VIP (NodePorts: 0.0.0.0 or ::; not an address: 4)."""
    try:
        return ipaddress.ip_address(vip).version
    except ValueError:
        return 4


def map_modules(family: int) -> tuple[ModuleType, ModuleType, ModuleType]:
    """(frontend, backend, affinity) map modules of a family."""
    if family == 6:
        return nat_frontend6, nat_backend6, nat_affinity6
    return fe_map, be_map, aff_map


class BpfNatManager(ManagerBase):
    name = "bpf-nat"
    policy_critical = False  # services, not policy: policy applies to the translated flow

    def __init__(self, frontend_map: Any, backend_map: Any, affinity_map: Any,
                 vip_filter_map: Any, *, family: int = 4) -> None:
        super().__init__()
        if family not in (4, 6) or (family == 6) != (vip_filter_map is None):
            raise ValueError(f"BpfNatManager: family {family!r} needs "
                             f"{'no' if family == 6 else 'a'} VIP filter map")
        self.family = family
        self._fe, self._be, self._aff = map_modules(family)
        if family == 6:
            self.name = "bpf-nat6"
        self._frontends = MapMirror(frontend_map)
        self._backends = MapMirror(backend_map)
        self._affinity = affinity_map
        self._filter = MapMirror(vip_filter_map) if vip_filter_map is not None else None
        self.desired: dict[str, proto.ServiceFrontendUpdate] = {}
        self._ids: dict[bytes, int] = {}  # frontend key -> service id (adopted or given)
        self._owned: set[bytes] = set()  # frontend keys written by this run
        self._dirty = True
        self.problems: list[str] = []
        self.on_close: Callable[[], None] | None = None

    # --- inputs ---------------------------------------------------------------------------

    def on_update(self, msg: object) -> None:
        if isinstance(msg, proto.ServiceFrontendUpdate):
            if vip_family(msg.vip) != self.family:
                return
            self.desired[msg.id] = msg
            self._dirty = True
        elif isinstance(msg, proto.ServiceFrontendRemove):
            if self.desired.pop(msg.id, None) is not None:
                self._dirty = True
        elif isinstance(msg, proto.InSync):
            self._datastore_in_sync = True
            self._dirty = True

    # --- apply ----------------------------------------------------------------------------

    def apply(self) -> None:
        if not self._dirty and not self._resync_requested:
            return
        try:
            if self._resync_requested:
                self._frontends.reload()
                self._backends.reload()
                if self._filter is not None:
                    self._filter.reload()
                self._ids = {k: self._fe.decode_value(v)["service_id"]
                             for k, v in (self._frontends.actual or {}).items()}
                self._drop_orphan_affinity(set(self._ids.values()))
                self._resync_requested = False
            self._apply()
        except Exception:
            self._resync_requested = True
            raise
        for mirror in (self._frontends, self._backends):
            metrics.MAP_ENTRIES.labels(mirror.name).set(len(mirror.actual or {}))
            metrics.MAP_MAX_ENTRIES.labels(mirror.name).set(mirror.map.max_entries)
        self._dirty = False

    def _service_id(self, key: bytes, taken: set[int]) -> int:
        sid = self._ids.get(key)
        if sid is None:
            sid = 1
            while sid in taken:
                sid += 1
            self._ids[key] = sid
        taken.add(sid)
        return sid

    def _apply(self) -> None:
        problems: list[str] = []
        actual_fe = self._frontends.actual or {}
        desired_keys = {frontend_key(m): m for m in self.desired.values()}
        # ids of frontends that stay pinned (live, or stale but not yet deletable) are taken
        taken = {self._ids[k] for k in actual_fe if k in self._ids}
        taken |= {self._ids[k] for k in desired_keys if k in self._ids}
        # the VIP filter first covers every frontend present or about to be
        self._write_filter({self._fe.decode_key(k)["vip"] for k in actual_fe}
                           | {m.vip for m in desired_keys.values()})
        desired_be: dict[bytes, bytes] = {}
        backends_of: dict[bytes, dict[bytes, bytes]] = {}
        for key, msg in sorted(desired_keys.items()):
            sid = self._service_id(key, taken)
            entries = {self._be.encode_key(sid, i): self._be.encode_value(b.addr, b.port)
                       for i, b in enumerate(msg.backends)}
            backends_of[key] = entries
            desired_be.update(entries)
        be_updates = self._backends.updates(desired_be)
        before = self._backends.actual or {}
        replaced = {be_map.decode_key(k)[0] for k, _ in be_updates if k in before}
        failed_be = set(self._backends.write(be_updates))
        desired_fe: dict[bytes, bytes] = {}
        for key, msg in desired_keys.items():
            count = len(msg.backends)
            if failed_be & backends_of[key].keys():
                count = 0
                problems.append(f"service frontend {msg.id} ({msg.service}): its "
                                f"{len(msg.backends)} backends do not fit in "
                                f"{self._be.PARAMS.name}; "
                                "rejecting its traffic")
            flags = fe_map.FrontendFlags(0)
            if msg.affinity_timeout:
                flags |= fe_map.FrontendFlags.AFFINITY
            if msg.kind == "external":
                flags |= fe_map.FrontendFlags.EXTERNAL
            elif msg.kind == "nodeport":
                flags |= fe_map.FrontendFlags.NODEPORT
            inline = [(b.addr, b.port) for b in msg.backends] if count else []
            desired_fe[key] = self._fe.encode_value(self._ids[key], count, flags,
                                                  msg.affinity_timeout, inline)
        if failed_be:
            metrics.MAP_FULL_ERRORS.labels(self._be.PARAMS.name).inc()
        failed_fe = self._frontends.write(self._frontends.updates(desired_fe))
        if failed_fe:
            metrics.MAP_FULL_ERRORS.labels(self._fe.PARAMS.name).inc()
            problems.append(f"{self._fe.PARAMS.name} is full (max_entries="
                            f"{self._frontends.map.max_entries}): {len(failed_fe)} service "
                            "frontends left out")
        # stale entries: of frontends this run programmed, at once; of others after InSync
        stale_fe = [k for k in self._frontends.stale(desired_fe)
                    if k in self._owned or self._datastore_in_sync]
        self._frontends.delete(stale_fe)
        self._owned = (self._owned | desired_fe.keys()) - set(stale_fe) - set(failed_fe)
        desired_ids = {self._ids[k] for k in desired_keys}
        live_ids = {self._ids[k] for k in (self._frontends.actual or {}) if k in self._ids}
        stale_be = [k for k in self._backends.stale(desired_be)
                    if be_map.decode_key(k)[0] in desired_ids
                    or be_map.decode_key(k)[0] not in live_ids]
        self._backends.delete(stale_be)
        self._clean_affinity(desired_be, replaced | {be_map.decode_key(k)[0] for k in stale_be})
        for key in stale_fe:
            self._ids.pop(key, None)
        # then only the frontends that remain
        self._write_filter({self._fe.decode_key(k)["vip"]
                            for k in self._frontends.actual or {}})
        if problems != self.problems:
            for problem in sorted(set(problems) - set(self.problems)):
                log.error("BPF NAT: %s", problem)
            self.problems = problems

    def _write_filter(self, vips: set[str]) -> None:
        if self._filter is None:
            return
        words = self._filter.map.max_entries
        self._filter.write(self._filter.updates(filter_map.contents(vips, words)))

    def _drop_orphan_affinity(self, pinned_ids: set[int]) -> None:
        """At a (re)sync: affinity entries of service ids that no pinned frontend has. Such
        an id may be given to another Service next (after `nat_frontend` was replaced: a
        new layout version or size), whose clients must not be sent to the old backends."""
        doomed = [k for k, _ in self._affinity.items()
                  if self._aff.decode_key(k)[0] not in pinned_ids]
        if doomed:
            self._affinity.delete_many(doomed)
            metrics.MAP_WRITES.labels(self._aff.PARAMS.name, "delete").inc(len(doomed))

    def _clean_affinity(self, desired_be: dict[bytes, bytes], touched: set[int]) -> None:
        """Affinity entries of the service ids in `touched` whose backend is gone."""
        if not touched:
            return
        present: dict[int, set[tuple[str, int]]] = {}
        for key, value in desired_be.items():
            present.setdefault(be_map.decode_key(key)[0], set()).add(self._be.decode_value(value))
        doomed = []
        for key, value in self._affinity.items():
            sid, _client = self._aff.decode_key(key)
            if sid in touched:
                addr, port, _ = self._aff.decode_value(value)
                if (addr, port) not in present.get(sid, set()):
                    doomed.append(key)
        if doomed:
            self._affinity.delete_many(doomed)
            metrics.MAP_WRITES.labels(self._aff.PARAMS.name, "delete").inc(len(doomed))

    # --- views ----------------------------------------------------------------------------

    def service_ids(self) -> dict[str, int]:
        """Frontend id -> service id, for the frontends this manager programs."""
        return {fid: self._ids[frontend_key(m)] for fid, m in sorted(self.desired.items())
                if frontend_key(m) in self._ids}

    def close(self) -> None:
        if self.on_close is not None:
            self.on_close()
            self.on_close = None
