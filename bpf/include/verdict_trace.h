/* verdict_trace.h: what calico_policy decided for a packet `pyfelix explain` crafted.
 *
 * Python twin: agent/bpf/maps/verdict_trace.py (struct verdict_trace, PF_MARK_TRACE and the
 * VT_* reasons must match); the caller is agent/bpf/explain.py.
 *
 * `pyfelix explain` runs the attached program on a crafted packet with BPF_PROG_TEST_RUN
 * and skb->mark == PF_MARK_TRACE (a whole-mark compare, like PF_MARK_HAIRPIN). For such a
 * packet policy_verdict (tc.c) writes verdict_trace[0] (the deciding record of the chain,
 * its counter id, the verdict) and counts nothing, creates no conntrack entry: no counter
 * moves and no flow is left behind because of an explain. Real packets never write it.
 * Python zeroes the slot before the run (under a lock file, one explain at a time per pin
 * directory) and reads it after; a slot still zero means the verdict came before policy
 * (conntrack, no endpoint, source check, service NAT).
 */
#ifndef PYFELIX_VERDICT_TRACE_H
#define PYFELIX_VERDICT_TRACE_H

#include "common.h"

#define PF_MARK_TRACE 0x7e5a1c0d

#define VT_RULE 1        /* an ALLOW/DENY record of the chain matched */
#define VT_NO_MATCH 2    /* the classifier found nothing (or failed): deny */
#define VT_EP_TO_HOST 3  /* allowed by policy, dropped by DefaultEndpointToHostAction */

#ifndef VERDICT_TRACE_MAX_ENTRIES
#define VERDICT_TRACE_MAX_ENTRIES 1
#endif

struct verdict_trace {
	__u32 chain_start; /* rules index of the chain's first record */
	__u32 chain_len;
	__u32 record;      /* the deciding record, relative to chain_start (VT_RULE) */
	__u32 counter_id;  /* its rule_counters id (ids.h kind RULE names it) */
	__u32 endpoint_id;
	__u8 hook;         /* HOOK_* */
	__u8 allowed;
	__u8 reason;       /* VT_*; 0: not written */
	__u8 pad;
};

BPF_TABLE_PINNED("array", __u32, struct verdict_trace, verdict_trace,
		 VERDICT_TRACE_MAX_ENTRIES, PIN_DIR "/verdict_trace_v1");

PF_INLINE void trace_verdict(__u32 chain_start, __u32 chain_len, __u32 record,
			     __u32 counter_id, __u32 endpoint_id, __u8 hook, int allowed,
			     __u8 reason)
{
	__u32 zero = 0;
	struct verdict_trace *t = verdict_trace.lookup(&zero);
	if (!t)
		return;
	t->chain_start = chain_start;
	t->chain_len = chain_len;
	t->record = record;
	t->counter_id = counter_id;
	t->endpoint_id = endpoint_id;
	t->hook = hook;
	t->allowed = allowed ? 1 : 0;
	t->reason = reason;
}

#endif /* PYFELIX_VERDICT_TRACE_H */
