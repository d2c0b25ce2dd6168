"""Conversion of Kubernetes objects into Calico's model, as Calico's datastore driver does it.

See `agent.conversion.k8s` for the rules. Entry point: `to_calico(resource)`.
"""

from pyfelix.agent.conversion.k8s import (
    DEFAULT_INTERFACE_PREFIX,
    k8s_policy_to_calico,
    label_selector_to_calico,
    namespace_to_profile,
    natural_output_key,
    pod_endpoint_problem,
    pod_to_workload_endpoint,
    service_account_to_profile,
    to_calico,
    workload_endpoint_name,
    workload_interface_name,
)

__all__ = [
    "DEFAULT_INTERFACE_PREFIX",
    "k8s_policy_to_calico",
    "label_selector_to_calico",
    "namespace_to_profile",
    "natural_output_key",
    "pod_endpoint_problem",
    "pod_to_workload_endpoint",
    "service_account_to_profile",
    "to_calico",
    "workload_endpoint_name",
    "workload_interface_name",
]
