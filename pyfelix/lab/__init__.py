"""Network-namespace lab: scenarios -> namespaces, pods, servers, probes, guaranteed teardown.

Modules, in the order a run uses them:
- `naming`    every name and path the lab creates (the run id prefix `pf<hex>-`).
- `scenario`  parse and validate scenario YAML (docs/ARCHITECTURE.md section 10;
              examples in tests/lab/scenarios/).
- `runstate`  per-run state dir + liveness lock; sweep of stale runs.
- `netns`     create/remove/list namespaces; move the calling thread into one.
- `topology`  underlay bridge, node and pod namespaces, veths, addresses, routes.
- `servers`   TCP/UDP echo servers in pod namespaces.
- `datastore` the run's file datastore (topology documents + scenario resources).
- `probe`     allow/deny probes from pod namespaces.
- `runner`    `LabRunner` / `run_scenario`: the whole life of a run, and the agent hook.

Everything here needs root except `naming`, `scenario` and `datastore`.
"""
