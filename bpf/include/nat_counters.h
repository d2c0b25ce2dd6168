/* nat_counters.h: what the service NAT did, one u64 per reason (per-CPU array).
 *
 * Python twin: agent/bpf/maps/nat_counters.py (NAT_CNT_* indexes must match). A map of its
 * own, beside global_counters, so the NAT's counters do not renumber the policy ones.
 */
#ifndef PYFELIX_NAT_COUNTERS_H
#define PYFELIX_NAT_COUNTERS_H

#include "common.h"

#define NAT_CNT_NEW_FLOWS 0     /* first packets to a frontend: a backend was chosen */
#define NAT_CNT_CT_HIT 1        /* later packets of a flow, translated from nat_ct */
#define NAT_CNT_REPLIES 2       /* replies whose source went back to the VIP */
#define NAT_CNT_AFFINITY_HIT 3  /* new flows sent to the client's affinity backend */
#define NAT_CNT_REJECTED 4      /* to a frontend without backends: ICMP unreachable sent */
#define NAT_CNT_REJECT_FAILED 5 /* the reject could not be built: dropped */
#define NAT_CNT_XLATE_FAILED 6  /* a rewrite failed (or SCTP port change): dropped */
#define NAT_CNT_NO_BACKEND 7    /* backend index missing (mid-update): dropped */
#define NAT_CNT_NODEPORT_NEW 8  /* first packets to a NodePort (also counted in NEW_FLOWS) */
#define NAT_CNT_NODEPORT_SNAT 9 /* ... of those, source-NATed to a backend on another node */
#define NAT_CNT_SNAT_NO_PORT 10 /* no free SNAT port for a NodePort flow: dropped */
#define NAT_CNT_NO_ROUTE 11     /* a NodePort packet with no route to its new destination: dropped */
#define NAT_CNT_COUNT 12

#ifndef NAT_COUNTERS_MAX_ENTRIES
#define NAT_COUNTERS_MAX_ENTRIES 16
#endif

BPF_TABLE_PINNED("percpu_array", __u32, __u64, nat_counters, NAT_COUNTERS_MAX_ENTRIES,
		 PIN_DIR "/nat_counters_v2");

PF_INLINE void count_nat(__u32 idx)
{
	__u64 *c = nat_counters.lookup(&idx);
	if (c)
		*c += 1;
}

#endif /* PYFELIX_NAT_COUNTERS_H */
