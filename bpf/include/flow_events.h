/* flow_events.h: one event per policy decision (a new flow's verdict; every packet of a
 * denied flow), through a BPF ring buffer, for the agent's flow logs.
 *
 * Python twin: agent/bpf/maps/flow_events.py (struct flow_event); the reader is
 * agent/dataplane/managers/flow_logs.py (BCC's ring buffer API).
 *
 * Only when the config map's CFG_F_FLOW_EVENTS is set (FlowLogsFileEnabled). Rate-limited
 * in the kernel, so a flood of new flows cannot starve the agent: at most
 * FLOW_EVENTS_PER_SEC events per CPU per one-second window (flow_budget, per CPU); an event
 * over the budget, or one the ring buffer has no room for, is not sent and is counted
 * (GCNT_FLOW_EVENTS_DROPPED); sent ones count GCNT_FLOW_EVENTS. Neither map is pinned: a
 * build's programs and its reader share them.
 */
#ifndef PYFELIX_FLOW_EVENTS_H
#define PYFELIX_FLOW_EVENTS_H

#include "common.h"
#include "counters.h"
#include "config.h"

#ifndef FLOW_EVENTS_PER_SEC
#define FLOW_EVENTS_PER_SEC 5000
#endif
#ifndef FLOW_EVENTS_PAGES
#define FLOW_EVENTS_PAGES 64 /* 256 KiB: ~5,000 events waiting for the reader */
#endif

struct flow_event {
	__u64 ts_ns;       /* ct_now_ns() */
	struct pf_addr src; /* both families (IPv4 in w[0]), network byte order */
	struct pf_addr dst;
	__u16 sport;       /* host byte order (ICMP/ICMPv6: echo id) */
	__u16 dport;
	__u8 proto;
	__u8 hook;         /* HOOK_*: from_wep = the source pod's egress, to_wep = ingress */
	__u8 allowed;
	__u8 family;       /* 4 or 6 */
	__u32 counter_id;  /* the deciding record's rule counter (0: none) */
	__u32 endpoint_id;
	__u32 len;         /* the packet's length */
};

struct flow_budget {
	__u64 window_ns;
	__u64 sent;
};

BPF_RINGBUF_OUTPUT(flow_events, FLOW_EVENTS_PAGES);
BPF_PERCPU_ARRAY(flow_budget, struct flow_budget, 1);

PF_INLINE void emit_flow_event(struct pkt_info *pkt, __u8 hook, int allowed, __u32 counter_id,
			       __u32 endpoint_id, __u64 now)
{
	__u32 zero = 0;
	struct config_value *cfg = config.lookup(&zero);
	if (!cfg || !(cfg->flags & CFG_F_FLOW_EVENTS))
		return; /* flow logs off: nothing sent, nothing counted */
	struct flow_budget *b = flow_budget.lookup(&zero);
	if (!b)
		return;
	if (now - b->window_ns >= 1000000000ULL) {
		b->window_ns = now;
		b->sent = 0;
	}
	if (b->sent >= FLOW_EVENTS_PER_SEC) {
		count_global(GCNT_FLOW_EVENTS_DROPPED);
		return;
	}
	struct flow_event *e = flow_events.ringbuf_reserve(sizeof(struct flow_event));
	if (!e) {
		count_global(GCNT_FLOW_EVENTS_DROPPED);
		return;
	}
	b->sent += 1;
	e->ts_ns = now;
	e->src = pkt->src;
	e->dst = pkt->dst;
	e->sport = pkt->sport;
	e->dport = pkt->dport;
	e->proto = pkt->proto;
	e->hook = hook;
	e->allowed = allowed ? 1 : 0;
	e->family = pkt->family;
	e->counter_id = counter_id;
	e->endpoint_id = endpoint_id;
	e->len = pkt->len;
	flow_events.ringbuf_submit(e, 0);
	count_global(GCNT_FLOW_EVENTS);
}

#endif /* PYFELIX_FLOW_EVENTS_H */
