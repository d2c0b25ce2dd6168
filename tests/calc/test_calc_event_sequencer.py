"""EventSequencer: coalescing within a batch, and the flush order seen by a strict dataplane."""

from __future__ import annotations

import pytest
from calc_testlib import wep

from pyfelix.agent import proto
from pyfelix.agent.calc import EventSequencer, ExpectedDataplane, OrderingViolation
from pyfelix.agent.calc.policy_resolver import EndpointTiers
from pyfelix.agent.model import parse_resource
from pyfelix.agent.syncer.api import ResourceKey

RULE_USING_S1 = proto.Rule(action="allow", src_ip_set_ids=("s1",))
POLICY = proto.Policy(inbound_rules=(RULE_USING_S1,))
PID = proto.PolicyID("default", "p")
TIERS = EndpointTiers(tiers=(proto.TierInfo("default", ingress_policies=("p",)),))
KEY = ResourceKey("WorkloadEndpoint", "prod", "wep-a")


def _setup() -> tuple[EventSequencer, ExpectedDataplane]:
    dp = ExpectedDataplane()
    return EventSequencer(dp), dp


def _names(dp: ExpectedDataplane) -> list[str]:
    return [type(m).__name__ for m in dp.messages]


def test_dependency_order_of_a_first_flush() -> None:
    seq, dp = _setup()
    endpoint = parse_resource(wep("prod", "a", "node1", "10.65.0.1"))
    # inputs arrive in the "wrong" order; the flush must still be applicable in order
    seq.on_endpoint_tiers(KEY, endpoint, TIERS)
    seq.on_policy_update(PID, POLICY)
    seq.on_ip_set_added("s1", "net")
    seq.on_ip_set_member_added("s1", "10.0.0.1/32")
    seq.on_datastore_in_sync()
    assert dp.messages == []  # nothing leaves before flush()
    seq.flush()
    assert _names(dp) == ["IPSetUpdate", "ActivePolicyUpdate", "WorkloadEndpointUpdate",
                          "InSync"]
    assert dp.ip_sets == {"s1": {"10.0.0.1/32"}}
    # and the removal of everything, again given in the wrong order
    seq.on_ip_set_removed("s1")
    seq.on_policy_remove(PID)
    seq.on_endpoint_tiers(KEY, None, EndpointTiers())
    seq.flush()
    assert _names(dp)[4:] == ["WorkloadEndpointRemove", "ActivePolicyRemove", "IPSetRemove"]
    assert not dp.ip_sets and not dp.policies and not dp.workload_endpoints


def test_in_sync_once_and_last() -> None:
    seq, dp = _setup()
    seq.flush()
    assert dp.messages == []
    seq.on_datastore_in_sync()
    seq.on_config_update({"LogSeverityScreen": "Info"})
    seq.flush()
    seq.on_datastore_in_sync()
    seq.flush()
    assert _names(dp) == ["ConfigUpdate", "InSync"]


def test_member_changes_coalesce_into_one_delta() -> None:
    seq, dp = _setup()
    seq.on_ip_set_added("s1", "net")
    seq.on_ip_set_member_added("s1", "a")
    seq.on_ip_set_member_added("s1", "b")
    seq.flush()
    seq.on_ip_set_member_added("s1", "c")
    seq.on_ip_set_member_removed("s1", "c")   # cancels
    seq.on_ip_set_member_removed("s1", "a")
    seq.on_ip_set_member_added("s1", "a")     # cancels
    seq.on_ip_set_member_removed("s1", "b")
    seq.on_ip_set_member_added("s1", "d")
    seq.flush()
    assert dp.messages[-1] == proto.IPSetDeltaUpdate("s1", added=frozenset({"d"}),
                                                     removed=frozenset({"b"}))
    seq.on_ip_set_member_added("s1", "e")
    seq.on_ip_set_member_removed("s1", "e")
    assert seq.flush() == 0


def test_set_recreated_within_a_batch_is_resent_whole() -> None:
    seq, dp = _setup()
    seq.on_ip_set_added("s1", "net")
    seq.on_ip_set_member_added("s1", "a")
    seq.flush()
    seq.on_ip_set_removed("s1")
    seq.on_ip_set_added("s1", "net")
    seq.on_ip_set_member_added("s1", "b")
    seq.flush()
    assert dp.messages[-1] == proto.IPSetUpdate("s1", "net", frozenset({"b"}))
    assert "IPSetRemove" not in _names(dp)
    assert dp.ip_sets == {"s1": {"b"}}


def test_things_born_and_gone_within_a_batch_send_nothing() -> None:
    seq, dp = _setup()
    seq.on_datastore_in_sync()
    seq.flush()
    assert _names(dp) == ["InSync"]
    seq.on_ip_set_added("s1", "net")
    seq.on_ip_set_member_added("s1", "a")
    seq.on_ip_set_removed("s1")
    seq.on_policy_update(PID, POLICY)
    seq.on_policy_remove(PID)
    seq.on_profile_remove("never-sent")
    seq.on_route_update("10.0.0.0/24", proto.RouteUpdate("10.0.0.0/24", "remote_workload"))
    seq.on_route_update("10.0.0.0/24", None)
    seq.on_host_ip_update("n", "1.2.3.4")
    seq.on_host_ip_update("n", None)
    assert seq.flush() == 0
    assert _names(dp) == ["InSync"]


def test_unchanged_updates_are_dropped() -> None:
    seq, dp = _setup()
    assert not dp.messages
    seq.on_ip_set_added("s1", "net")
    seq.on_policy_update(PID, POLICY)
    seq.on_profile_update("prof", proto.Profile())
    seq.flush()
    seq.on_policy_update(PID, proto.Policy(inbound_rules=(RULE_USING_S1,)))
    seq.on_profile_update("prof", proto.Profile())
    assert seq.flush() == 0


def test_endpoint_identity_change_removes_the_old_id() -> None:
    seq, dp = _setup()
    seq.on_endpoint_tiers(KEY, parse_resource(wep("prod", "a", "node1", "10.65.0.1")),
                          EndpointTiers())
    seq.flush()
    renamed = wep("prod", "a", "node1", "10.65.0.1")
    renamed["spec"]["pod"] = "a2"
    seq.on_endpoint_tiers(KEY, parse_resource(renamed), EndpointTiers())
    seq.flush()
    assert _names(dp)[-2:] == ["WorkloadEndpointUpdate", "WorkloadEndpointRemove"]
    assert [i.workload for i in dp.workload_endpoints] == ["prod/a2"]


def test_strict_dataplane_rejects_dangling_references() -> None:
    dp = ExpectedDataplane()
    with pytest.raises(OrderingViolation, match="unknown IP sets"):
        dp.send(proto.ActivePolicyUpdate(PID, POLICY))
    dp.send(proto.IPSetUpdate("s1", "net"))
    dp.send(proto.ActivePolicyUpdate(PID, POLICY))
    with pytest.raises(OrderingViolation, match="still used"):
        dp.send(proto.IPSetRemove("s1"))
    with pytest.raises(OrderingViolation, match="adds existing"):
        dp.send(proto.IPSetUpdate("s2", "net", frozenset({"a"})))
        dp.send(proto.IPSetDeltaUpdate("s2", added=frozenset({"a"})))
    lenient = ExpectedDataplane(strict=False)
    lenient.send(proto.IPSetRemove("nope"))
    assert lenient.violations


def test_endpoint_id_taken_over_by_another_key_is_not_removed() -> None:
    seq, dp = _setup()
    doc = wep("prod", "a", "node1", "10.65.0.1")
    seq.on_endpoint_tiers(KEY, parse_resource(doc), EndpointTiers())
    seq.flush()
    renamed = dict(doc, metadata={**doc["metadata"], "name": "wep-a-renamed"})
    other_key = ResourceKey("WorkloadEndpoint", "prod", "wep-a-renamed")
    seq.on_endpoint_tiers(KEY, None, EndpointTiers())
    seq.on_endpoint_tiers(other_key, parse_resource(renamed), EndpointTiers())
    seq.flush()
    assert _names(dp) == ["WorkloadEndpointUpdate", "WorkloadEndpointUpdate"]
    assert [i.workload for i in dp.workload_endpoints] == ["prod/a"]
    seq.on_endpoint_tiers(other_key, None, EndpointTiers())
    seq.flush()
    assert _names(dp)[-1] == "WorkloadEndpointRemove" and not dp.workload_endpoints
