/* config.h: dataplane-wide settings, one array entry written by Python.
 *
 * Python twin: agent/bpf/maps/config.py (struct config_value must match).
 *
 * endpoint_to_host_action: what happens to a NEW flow from a workload to an address of this
 * host (routes.h entry with RT_F_LOCAL_HOST) after the workload's egress policy allowed it.
 * Felix's DefaultEndpointToHostAction: Drop (the zero value, so an unwritten map is safe),
 * Accept, or Return. There is no host-endpoint policy in the tc programs yet, so Return
 * behaves like Accept (documented in bpf/README.md).
 *
 * flags & CFG_RPF_MASK: Felix's BPFEnforceRPF for packets arriving on host endpoint
 * interfaces (calico_from_hep): Strict (the zero value, so an unwritten map is the safe
 * one), Loose, or Disabled.
 *
 * flags & CFG_REDIRECT_DISABLED: Felix's BPFRedirectToPeer=Disabled. Otherwise (Enabled,
 * L2Only, and the zero value) an allowed packet from a pod to another pod of this node is
 * redirected to the destination's host interface (tc.c, fastpath_verdict) instead of going
 * through the host's routing, netfilter and kernel conntrack; the destination's tc egress
 * program still applies its ingress policy, so the verdicts are the same either way.
 *
 * flags & CFG_CTLB_UDP: Felix's BPFConnectTimeLoadBalancing=Enabled (TCP and UDP); with TCP
 * (Felix's default) ctlb.c translates TCP connects only.
 *
 * flags & CFG_DROP_VXLAN_FROM_WEP: VXLAN is in use and AllowVXLANPacketsFromWorkloads is
 * false: UDP from a workload to port (flags >> CFG_VXLAN_PORT_SHIFT) (VXLANPort) drops.
 * flags & CFG_DROP_IPIP_FROM_WEP: IPIP is in use and AllowIPIPPacketsFromWorkloads is false:
 * IPv4 protocol 4 from a workload drops. Encapsulation would carry a pod's traffic past its
 * egress policy (Felix's "Drop VXLAN/IPinIP encapped packets originating in workloads").
 */
#ifndef PYFELIX_CONFIG_H
#define PYFELIX_CONFIG_H

#include "common.h"

#define EP_TO_HOST_DROP 0
#define EP_TO_HOST_ACCEPT 1
#define EP_TO_HOST_RETURN 2

#define CFG_RPF_MASK 0x3
#define CFG_RPF_STRICT 0   /* the source's route must lead back out of the arrival interface */
#define CFG_RPF_LOOSE 1    /* the source must be routable (not local, blackhole, unreachable) */
#define CFG_RPF_DISABLED 2
#define CFG_F_FLOW_EVENTS 0x20 /* FlowLogsFileEnabled: send flow events (flow_events.h) */

#define CFG_REDIRECT_DISABLED 0x04
#define CFG_CTLB_UDP 0x08 /* BPFConnectTimeLoadBalancing=Enabled: UDP too (ctlb.c) */
#define CFG_IPV6_DISABLED 0x10 /* Ipv6Support false: IPv6 from/to workloads drops (ND passes) */
#define CFG_DROP_VXLAN_FROM_WEP 0x40
#define CFG_DROP_IPIP_FROM_WEP 0x80
#define CFG_VXLAN_PORT_SHIFT 16 /* the VXLAN port sits in the top 16 bits of flags */

struct config_value {
	__u32 flags; /* CFG_RPF_* in the low bits, CFG_REDIRECT_DISABLED, CFG_CTLB_UDP,
		      * CFG_IPV6_DISABLED, CFG_F_FLOW_EVENTS, CFG_DROP_*_FROM_WEP; the VXLAN
		      * port in the top 16 bits; the rest 0 */
	__u32 endpoint_to_host_action; /* EP_TO_HOST_* */
};

BPF_TABLE_PINNED("array", __u32, struct config_value, config, 1, PIN_DIR "/config_v1");

#endif /* PYFELIX_CONFIG_H */
