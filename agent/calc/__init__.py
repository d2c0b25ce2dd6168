"""The calculation graph: validated datastore state -> ordered `proto` messages for one node.

Role (docs/ARCHITECTURE.md section 4; Felix's `felix/calc`): single-threaded, no I/O. The pieces:
- `graph.build_calc_graph(hostname, callbacks)`: the one wiring function (read it first);
- nodes: `dispatcher` (fan-out by kind, local-endpoint filter), `active_rules`,
  `rule_scanner`, `ipset_index` (+ `selector_index`, `labels`), `policy_resolver`,
  `profile_decoder`, `passthru` (config, host IPs, IP pools), `route_resolver`;
- `event_sequencer.EventSequencer`: coalesces and flushes messages in dependency order;
- `pipeline.CalcPipeline`: syncer callbacks -> validator -> graph -> sequencer, one thread;
- `expected_dataplane.ExpectedDataplane`: a dataplane model fed by the messages that checks
  their ordering contract (tests' recording fake, and `pyfelix calc`'s output).

Imports only the model, selectors, syncer API and `proto`: never the dataplane.
"""

from pyfelix.agent.calc.event_sequencer import EventSequencer
from pyfelix.agent.calc.expected_dataplane import ExpectedDataplane, OrderingViolation
from pyfelix.agent.calc.graph import CalcGraph, build_calc_graph
from pyfelix.agent.calc.pipeline import CalcPipeline

__all__ = [
    "CalcGraph",
    "CalcPipeline",
    "EventSequencer",
    "ExpectedDataplane",
    "OrderingViolation",
    "build_calc_graph",
]
