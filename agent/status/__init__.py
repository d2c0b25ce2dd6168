"""Status reporting: the agent's node and endpoint status records in the datastore.

`records` (NodeStatus, EndpointStatus, StatusSnapshot), `stores` (file and etcd stores,
`open_status_store(location)`), `reporter` (the StatusReporter thread). See each module.
"""

from pyfelix.agent.status.records import EndpointStatus, NodeStatus, StatusSnapshot
from pyfelix.agent.status.reporter import StatusReporter
from pyfelix.agent.status.stores import StatusStoreError, open_status_store

__all__ = ["EndpointStatus", "NodeStatus", "StatusReporter", "StatusSnapshot",
           "StatusStoreError", "open_status_store"]
