/* counters.h: per-CPU packet/byte counters (the programs only add; Python sums the CPUs).
 *
 * Python twin: agent/bpf/maps/counters.py (structs rule_counter, ep_counter and the
 * GCNT_* indexes must match).
 *
 * Three per-CPU arrays:
 *   rule_counters[counter_id]   packets/bytes of every rule record that matched. counter_id
 *                               is allocated by Python per rule id (ids.h, kind RULE);
 *                               0 means "not counted" (guard records).
 *   ep_spoofed[endpoint_id]     packets/bytes each endpoint sent from a source it may not use
 *                               (dropped by the RPF check); apart from ep_counters so that
 *                               stays one cache line per entry on the per-packet path.
 *   ep_counters[endpoint_id]    allowed/denied packets and bytes per endpoint and direction,
 *                               index EP_CNT_<dir>_<verdict> in the arrays below. Direction
 *                               is the POD's: ingress = to_wep hook, egress = from_wep hook.
 *   global_counters[GCNT_*]     why packets took the path they took (one u64 each).
 */
#ifndef PYFELIX_COUNTERS_H
#define PYFELIX_COUNTERS_H

#include "common.h"

#ifndef RULE_COUNTERS_MAX_ENTRIES
#define RULE_COUNTERS_MAX_ENTRIES 16384
#endif
#ifndef EP_COUNTERS_MAX_ENTRIES
#define EP_COUNTERS_MAX_ENTRIES 16384
#endif
#define GLOBAL_COUNTERS_MAX_ENTRIES 32

struct rule_counter {
	__u64 packets;
	__u64 bytes;
};

#define EP_CNT_INGRESS_ALLOWED 0
#define EP_CNT_INGRESS_DENIED 1
#define EP_CNT_EGRESS_ALLOWED 2
#define EP_CNT_EGRESS_DENIED 3

struct ep_counter {
	__u64 packets[4]; /* indexed by EP_CNT_* */
	__u64 bytes[4];   /* 64 bytes in all: one cache line per endpoint and CPU */
};

/* global_counters indexes */
#define GCNT_UNKNOWN_PROTO_DROPPED 0 /* neither IPv4, ARP nor allowed IPv6 ND: dropped */
#define GCNT_MALFORMED_DROPPED 1  /* truncated/invalid IPv4 header */
#define GCNT_NO_ENDPOINT_DROPPED 2 /* a tc program ran on an ifindex with no endpoint entry */
#define GCNT_ADMIN_DOWN_DROPPED 3 /* endpoint not "active" */
#define GCNT_CT_HIT 4             /* established/reply packets allowed by conntrack */
#define GCNT_CT_RELATED 5         /* ICMP errors allowed because the inner flow is tracked */
#define GCNT_CT_EXPIRED 6         /* a conntrack entry was found but had timed out */
#define GCNT_CT_CREATED 7
#define GCNT_CT_CREATE_FAILED 8
#define GCNT_POLICY_ALLOWED 9
#define GCNT_POLICY_DENIED 10
#define GCNT_TAIL_CALL_FAILED 11  /* chain too long or walker missing: dropped */
#define GCNT_BAD_RULE_INDEX 12    /* chain points outside the rules array: dropped */
#define GCNT_EP_TO_HOST_DROPPED 13 /* DefaultEndpointToHostAction=Drop */
#define GCNT_FRAGMENTS 14         /* IPv4 fragments seen (evaluated without ports) */
#define GCNT_XDP_DROPPED 15       /* untracked deny hits in XDP */
#define GCNT_XDP_PASSED 16
#define GCNT_CLASSIFIER_STEPS 17 /* classifier steps (candidate words looked at; cost indicator) */
#define GCNT_SPOOFED_DROPPED 18   /* from a workload with a source it may not use (RPF) */
#define GCNT_IPV6_DROPPED 19      /* IPv6 other than ND with Ipv6Support false: dropped */
#define GCNT_IPV6_ND_PASSED 20    /* IPv6 neighbour discovery / MLD, link scope: passed */
#define GCNT_ARP_PASSED 21        /* ARP: passed */
#define GCNT_HEP_RPF_DROPPED 22   /* into a host endpoint from a source failing BPFEnforceRPF */
#define GCNT_CLASSIFIER_ERROR 23  /* a classifier lookup failed or was inconsistent: dropped */
#define GCNT_FASTPATH_REDIRECTED 24 /* pod to local pod: redirected past the host stack */
#define GCNT_FASTPATH_TTL_EXPIRED 25 /* would have been, but TTL <= 1: the stack replies */
#define GCNT_IPV6_EXT_DROPPED 26   /* IPv6 extension header chain not walked (unknown, too long) */
#define GCNT_IPV6_PACKETS 27       /* IPv6 packets policed (after ND, before the endpoint lookup) */
#define GCNT_FLOW_EVENTS 28         /* policy decisions sent to the flow-log ring buffer */
#define GCNT_FLOW_EVENTS_DROPPED 29 /* not sent: over the per-CPU budget or ring buffer full */
#define GCNT_TUNNEL_FROM_WEP_DROPPED 30 /* VXLAN/IPIP sent by a workload (Allow*FromWorkloads) */
#define GCNT_COUNT 31

BPF_TABLE_PINNED("percpu_array", __u32, struct rule_counter, rule_counters,
		 RULE_COUNTERS_MAX_ENTRIES, PIN_DIR "/rule_counters_v1");
BPF_TABLE_PINNED("percpu_array", __u32, struct ep_counter, ep_counters, EP_COUNTERS_MAX_ENTRIES,
		 PIN_DIR "/ep_counters_v1");
#ifndef EP_SPOOFED_MAX_ENTRIES
#define EP_SPOOFED_MAX_ENTRIES EP_COUNTERS_MAX_ENTRIES
#endif
BPF_TABLE_PINNED("percpu_array", __u32, struct rule_counter, ep_spoofed, EP_SPOOFED_MAX_ENTRIES,
		 PIN_DIR "/ep_spoofed_v1");
BPF_TABLE_PINNED("percpu_array", __u32, __u64, global_counters, GLOBAL_COUNTERS_MAX_ENTRIES,
		 PIN_DIR "/global_counters_v2");

PF_INLINE void count_global(__u32 idx)
{
	__u64 *v = global_counters.lookup(&idx);
	if (v)
		*v += 1;
}

PF_INLINE void count_global_n(__u32 idx, __u64 n)
{
	__u64 *v = global_counters.lookup(&idx);
	if (v)
		*v += n;
}

PF_INLINE void count_rule(__u32 counter_id, __u32 len)
{
	if (!counter_id)
		return;
	struct rule_counter *c = rule_counters.lookup(&counter_id);
	if (c) {
		c->packets += 1;
		c->bytes += len;
	}
}

/* hook = HOOK_FROM_WEP (pod egress) or HOOK_TO_WEP (pod ingress) */
PF_INLINE void count_endpoint(__u32 endpoint_id, __u8 hook, int allowed, __u32 len)
{
	__u32 idx = (hook == HOOK_TO_WEP) ? EP_CNT_INGRESS_ALLOWED : EP_CNT_EGRESS_ALLOWED;
	if (!allowed)
		idx += 1;
	struct ep_counter *c = ep_counters.lookup(&endpoint_id);
	if (!c)
		return;
	/* idx is 0..3; the mask keeps the verifier sure of it */
	c->packets[idx & 3] += 1;
	c->bytes[idx & 3] += len;
}

PF_INLINE void count_spoofed(__u32 endpoint_id, __u32 len)
{
	struct rule_counter *c = ep_spoofed.lookup(&endpoint_id);
	if (!c)
		return;
	c->packets += 1;
	c->bytes += len;
}

#endif /* PYFELIX_COUNTERS_H */
