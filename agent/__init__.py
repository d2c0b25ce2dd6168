"""pyfelix: a node dataplane agent in the architecture of Project Calico's Felix.

The package layout draws the pipeline; imports point down it only::

    agent.syncer ──> agent.validator ──> agent.calc ──> agent.proto messages
         (datastore)      (model)          (graph)            │
                                                              v
                          agent.dataplane (managers) ──> kernel (agent.bpf, netlink, iptables)

`agent.model` (typed resources) and `agent.selector` are leaves used by every stage.
"""
