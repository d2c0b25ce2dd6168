"""pyfelix: a node dataplane agent in the architecture of Project Calico's Felix.

One namespace for everything the distribution installs:

    pyfelix.agent   the node agent: syncer -> validator -> calc graph -> dataplane managers
    pyfelix.confd   BIRD configuration from the datastore (a process of its own)
    pyfelix.cli     the `pyfelix` command: parses arguments, formats output
    pyfelix.lab     the network-namespace lab and the conformance suite (a tool)
    pyfelix.bench   `pyfelix bench` (a tool)

In the repository `agent/`, `cli/` and `confd/` are top-level directories and
`pyfelix/agent`, `pyfelix/cli`, `pyfelix/confd` are symbolic links to them; the wheel
holds real copies under `pyfelix/`. Nothing imports the bare names (`agent`, `cli`,
`confd`): tests/test_import_graph.py checks it, since a module loaded under both names
would exist twice. The agent's own import graph never reaches the tools (an import-linter
contract). See docs/ARCHITECTURE.md.
"""
