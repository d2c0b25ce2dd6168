/* tc.c: policy programs for workload interfaces (host side of each pod's veth).
 *
 *   calico_from_wep  tc INGRESS of the host veth: packets the pod sends -> pod EGRESS policy
 *   calico_to_wep    tc EGRESS of the host veth: packets to the pod     -> pod INGRESS policy
 *   calico_policy    the classifier both of them tail-call (policy_progs[0], classifier.h)
 *   calico_from_hep  tc INGRESS of host endpoint interfaces: the reverse-path check of
 *                    Felix's BPFEnforceRPF (host endpoint POLICY is iptables' in BPF mode),
 *                    then NodePorts (nat.h; IPv6: nat6.h, its RPF check for the packets it
 *                    translates only)
 *   calico_from_host tc INGRESS of other data interfaces (BPFDataIfacePattern) while
 *                    NodePort frontends exist: NodePorts only (nat.h, nat6.h)
 *
 * Per packet: parse (common.h: IPv4 or IPv6, extension headers walked) -> neither: ARP
 * passes, everything else drops (fail closed); malformed or an IPv6 extension header chain
 * not walked drops -> IPv6 link-scope ND/MLD passes, and NS/NA between the pod and the
 * host to a routable address (ipv6_host_nd_passes); IPv6 with Ipv6Support false drops ->
 * endpoint by ifindex
 * (lookup_endpoint: the ep_by_ifindex array slot, else the endpoints hash)
 * (none: drop) -> admin-down drops -> from the pod: a source it may not use drops (RPF,
 * sources.h, both families) -> from the pod: service NAT (nat.h for IPv4, nat6.h for IPv6:
 * DNAT to a backend, or reject) ->
 * conntrack hit or related ICMP error: allow (to the pod: a service reply's source goes
 * back to the VIP, either family; from the pod: a NodePort reply's source goes back to the node address,
 * nat.h / nat6.h) -> to the pod: a NodePort flow's first packet is marked (nat_mark_nodeport,
 * nat6_mark_nodeport) ->
 * otherwise find the first matching record of the endpoint's chain for this direction
 * (classifier.h, policy.h); on allow create a
 * conntrack entry, and for a flow from the pod to this host apply endpoint_to_host_action ->
 * allowed from the pod to another local pod: redirected to its interface (fastpath_verdict).
 * Counters: counters.h. Verdicts are TC_ACT_OK / TC_ACT_SHOT. A packet marked PF_MARK_TRACE
 * (pyfelix explain's BPF_PROG_TEST_RUN) records its verdict in verdict_trace.h instead.
 */
#include "common.h"
#include "counters.h"
#include "ipsets.h"
#include "policy.h"
#include "endpoints.h"
#include "conntrack.h"
#include "routes.h"
#include "config.h"
#include "ids.h"
#include "sources.h"
#include "nat.h"
#include "nat6.h"
#include "verdict_trace.h"
#include "denied_sources.h"
#include "flow_events.h"

/* Enough linear bytes for Ethernet + IPv4 with options + an ICMP error's inner headers, or
 * IPv6 with extension headers (parse_ipv6 reads up to PF_IPV6_MAX_EXT_OFF + 8 for the
 * chain, then the L4 header; a packet whose headers lie beyond is malformed: dropped). */
#define PF_PULL_LEN 384

PF_INLINE int ep_to_host_allowed(struct pkt_info *pkt)
{
	if (!(route_flags(pkt) & RT_F_LOCAL_HOST))
		return 1;
	__u32 zero = 0;
	struct config_value *cfg = config.lookup(&zero);
	if (cfg && cfg->endpoint_to_host_action != EP_TO_HOST_DROP)
		return 1; /* Accept, or Return (no host-endpoint policy here yet) */
	return 0;
}

/* The fast path (config.h, CFG_REDIRECT_DISABLED): a packet from a pod that its egress
 * policy (or conntrack) allowed, to another pod of this node, is redirected to that pod's
 * host interface: bpf_redirect_neigh to its egress, where calico_to_wep applies the
 * destination's ingress policy exactly as it would after the stack. Skipped: the host's
 * routing, netfilter (iptables and kernel conntrack; the BPF conntrack stays the one state
 * both hooks use). The TTL is decremented as a router does; a packet whose TTL would expire
 * takes the normal path, so the stack sends Time Exceeded. Hairpin packets (nat.h) keep
 * their own redirect; everything else (to the host, off the node, IPv6) takes the normal
 * path. */
/* pf_redirect_neigh: see nat.h (BCC 0.26 declares bpf_redirect_neigh without `plen`). */

PF_INLINE int fastpath_verdict(struct __sk_buff *skb, struct pkt_info *pkt, int verdict,
				int reply)
{
	/* IPv6 takes the normal path (the TTL rewrite below is IPv4's hop count) */
	if (verdict != TC_ACT_OK || (pkt->flags & (PKT_F_HAIRPIN | PKT_F_HAIRPIN_REPLY)) ||
	    pkt_is_v6(pkt))
		return verdict;
	__u32 zero = 0;
	struct config_value *cfg = config.lookup(&zero);
	if (cfg && (cfg->flags & CFG_REDIRECT_DISABLED))
		return verdict;
	struct route_key key = {};
	key.prefixlen = ROUTE_KEY_FIXED_BITS + 32;
	key.family = 4;
	key.addr.w[0] = pkt->daddr;
	struct route_value *rt = routes.lookup(&key);
	if (!rt || !(rt->flags & RT_F_LOCAL_WORKLOAD) || rt->ifindex == 0 ||
	    rt->ifindex == skb->ifindex)
		return verdict;
	__u32 target = rt->ifindex;
	/* A reply goes straight to a local pod only when that pod's calico_from_wep tracked
	 * this very tuple. Otherwise the flow's forward packets were rewritten on the way
	 * (netfilter's DNAT of a floating IP: the pod sent to the floating IP, this pod saw its
	 * own address) and the reply needs the stack, where conntrack un-NATs it. */
	if (reply) {
		struct ct_key peer = {};
		ct_fill_pkt_key(&peer, target, pkt);
		if (!conntrack.lookup(&peer))
			return verdict;
	}
	/* TTL and protocol share a 16-bit word of the IPv4 header (offset 8) */
	__u16 old_word = 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + 8, &old_word, sizeof(old_word)))
		return verdict;
	__u8 *bytes = (__u8 *)&old_word;
	if (bytes[0] <= 1) {
		count_global(GCNT_FASTPATH_TTL_EXPIRED);
		return verdict;
	}
	__u16 new_word = old_word;
	((__u8 *)&new_word)[0] = bytes[0] - 1;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, old_word, new_word, sizeof(new_word)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + 8, &new_word, sizeof(new_word), 0))
		return verdict; /* unchanged or consistent: the normal path is still right */
	count_global(GCNT_FASTPATH_REDIRECTED);
	return pf_redirect_neigh(target, NULL, 0, 0);
}

/* A VXLAN or IPIP packet a workload sends while that encapsulation is in use and not allowed
 * from workloads (config.h, CFG_DROP_*_FROM_WEP): it would carry the pod's traffic past its
 * egress policy, so it drops before policy, as Felix's iptables rules drop it. */
PF_INLINE int tunnel_from_wep_dropped(struct pkt_info *pkt)
{
	if (pkt_is_v6(pkt))
		return 0;
	__u32 zero = 0;
	struct config_value *cfg = config.lookup(&zero);
	if (!cfg)
		return 0;
	__u32 flags = cfg->flags;
	if ((flags & CFG_DROP_IPIP_FROM_WEP) && pkt->proto == 4)
		return 1;
	return (flags & CFG_DROP_VXLAN_FROM_WEP) && pkt->proto == PF_IPPROTO_UDP &&
	       (pkt->flags & PKT_F_PORTS) && pkt->dport == (flags >> CFG_VXLAN_PORT_SHIFT);
}

/* Final verdict of the chain walk: counters, conntrack, endpoint-to-host. */
PF_INLINE int policy_verdict(struct policy_state *st, int allowed, __u32 counter_id)
{
	count_rule(counter_id, st->pkt.len);
	if (allowed && st->hook == HOOK_FROM_WEP && !ep_to_host_allowed(&st->pkt)) {
		count_global(GCNT_EP_TO_HOST_DROPPED);
		allowed = 0;
	}
	count_endpoint(st->endpoint_id, st->hook, allowed, st->pkt.len);
	emit_flow_event(&st->pkt, st->hook, allowed, counter_id, st->endpoint_id, ct_now_ns());
	if (!allowed) {
		count_global(GCNT_POLICY_DENIED);
		count_denied_source(counter_id, st->pkt.saddr, st->pkt.len);
		return TC_ACT_SHOT;
	}
	count_global(GCNT_POLICY_ALLOWED);
	ct_create(&st->pkt, st->ifindex, st->hook, ct_now_ns(), counter_id);
	return TC_ACT_OK;
}

/* The walk decided (st->decision, PD_*). A `pyfelix explain` packet records the decision
 * (verdict_trace.h) and counts and tracks nothing; any other gets policy_verdict. */
PF_INLINE int policy_decided(struct __sk_buff *skb, struct policy_state *st, __u8 decision)
{
	int allowed = decision == PD_ALLOW;
	if (st->trace) {
		__u8 reason = decision == PD_NO_MATCH ? VT_NO_MATCH : VT_RULE;
		if (allowed && st->hook == HOOK_FROM_WEP && !ep_to_host_allowed(&st->pkt)) {
			allowed = 0;
			reason = VT_EP_TO_HOST;
		}
		trace_verdict(st->chain_start, st->chain_len, st->idx, st->counter_id,
			      st->endpoint_id, st->hook, allowed, reason);
		return allowed ? TC_ACT_OK : TC_ACT_SHOT;
	}
	int verdict = policy_verdict(st, allowed, decision == PD_NO_MATCH ? 0 : st->counter_id);
	if (decision == PD_NO_MATCH)
		return verdict;
	verdict = nat_hairpin_verdict(skb, &st->pkt, verdict);
	if (st->hook == HOOK_FROM_WEP)
		verdict = fastpath_verdict(skb, &st->pkt, verdict, 0);
	return verdict;
}

int calico_policy(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct policy_state *st = policy_scratch.lookup(&zero);
	if (!st)
		return TC_ACT_SHOT;
	if (st->tail_calls == 0) {
		if (st->chain_len == 0) {
			st->decision = PD_NO_MATCH; /* an empty chain denies */
		} else if (cls_setup(&st->cls, st->chain_start, &st->pkt)) {
			count_global(GCNT_CLASSIFIER_ERROR);
			st->decision = PD_NO_MATCH;
		}
	}
	/* The decision is stored in the scratch map and acted on after the loop: one
	 * policy_decided call site instead of one per unrolled step (the verifier explores each
	 * inlined copy; values in map memory do not split its states): calico_policy went from
	 * 993,597 verified instructions (limit 1,000,000) to ~643,000 with the trace. */
	__u32 steps = 0;
	for (int i = 0; i < CLS_STEPS_PER_PROG && st->decision == PD_NONE; i++) {
		__u32 idx = 0;
		__u32 pos = st->idx;
		int rc = cls_step(&st->cls, pos, &idx);
		steps++;
		if (rc == CLS_MORE)
			continue;
		if (rc == CLS_END || rc == CLS_ERROR || idx >= st->chain_len) {
			if (rc != CLS_END)
				count_global(GCNT_CLASSIFIER_ERROR);
			st->decision = PD_NO_MATCH; /* nothing matched: deny */
			break;
		}
		__u32 abs_idx = st->chain_start + idx;
		struct policy_rule *r = rules.lookup(&abs_idx);
		if (!r) {
			count_global(GCNT_BAD_RULE_INDEX);
			st->decision = PD_NO_MATCH;
			break;
		}
		__u8 action = r->action;
		if (action == RULE_ACTION_ALLOW || action == RULE_ACTION_DENY) {
			st->idx = idx;
			st->counter_id = r->counter_id;
			st->decision = action == RULE_ACTION_ALLOW ? PD_ALLOW : PD_DENY;
			break;
		}
		__u32 next = idx + 1;
		if (action == RULE_ACTION_PASS || action == RULE_ACTION_SKIP) {
			next = r->jump;
			if (next <= idx) {
				count_global(GCNT_BAD_RULE_INDEX);
				st->decision = PD_NO_MATCH;
				break;
			}
			if (action == RULE_ACTION_PASS)
				count_rule(r->counter_id, st->pkt.len);
		} else {
			/* LOG (and any unknown action): count and continue */
			count_rule(r->counter_id, st->pkt.len);
		}
		st->idx = next;
		cls_advance(&st->cls, next);
	}
	count_global_n(GCNT_CLASSIFIER_STEPS, steps);
	__u8 decision = st->decision;
	if (decision != PD_NONE)
		return policy_decided(skb, st, decision);
	st->tail_calls += 1;
	policy_progs.call(skb, PROG_IDX_POLICY);
	/* only reached if the tail call failed: limit hit or walker missing */
	count_global(GCNT_TAIL_CALL_FAILED);
	return policy_verdict(st, 0, 0);
}

/* Frames that are neither IPv4 nor IPv6: ARP passes, the rest drops. */
PF_INLINE int non_ip_verdict(void *data, void *data_end)
{
	if (classify_non_ip(data, data_end) == NON4_ARP) {
		count_global(GCNT_ARP_PASSED);
		return TC_ACT_OK;
	}
	count_global(GCNT_UNKNOWN_PROTO_DROPPED);
	return TC_ACT_SHOT;
}

/* Neighbour solicitation/advertisement between the pod and the HOST to a routable address
 * (ipv6_nd_passes takes the link-scope ones): the kernel solicits with the source of the
 * packet it queued, so a pod that starts a connection from its global address asks for
 * the host's MAC from that address and the host's advertisement comes back to it (and the
 * host's unicast reachability probes go to it too). The iptables fallback accepts these in
 * INPUT/OUTPUT; here: to the pod, hop limit 255 (the host sent it: anything routed here
 * had its hop limit decremented), from the pod, hop limit 255 to one of the host's
 * addresses (never forwarded). Without it a pod whose ingress policy does not allow the
 * host could not start IPv6 connections until the host happened to solicit it. */
PF_INLINE int ipv6_host_nd_passes(struct pkt_info *pkt, int from_workload)
{
	if (!pkt_is_v6(pkt) || pkt->proto != PF_IPPROTO_ICMPV6 || !(pkt->flags & PKT_F_ICMP) ||
	    (pkt->flags & PKT_F_FRAGMENT) || pkt->hop_limit != 255 ||
	    (pkt->icmp_type != 135 && pkt->icmp_type != 136))
		return 0;
	return !from_workload || (route_flags(pkt) & RT_F_LOCAL_HOST);
}

/* IPv6 disabled (Ipv6Support false: the config map's CFG_IPV6_DISABLED)? */
PF_INLINE int ipv6_disabled(void)
{
	__u32 zero = 0;
	struct config_value *cfg = config.lookup(&zero);
	return cfg && (cfg->flags & CFG_IPV6_DISABLED);
}

PF_INLINE int policy_entry(struct __sk_buff *skb, __u8 hook)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 linear = data_end - data;
	if (linear < PF_PULL_LEN && skb->len > linear) {
		bpf_skb_pull_data(skb, skb->len < PF_PULL_LEN ? skb->len : PF_PULL_LEN);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}

	struct pkt_info pkt = {};
	int rc = parse_packet(data, data_end, &pkt);
	if (rc == PARSE_NOT_IP)
		return non_ip_verdict(data, data_end);
	if (rc == PARSE_V6_EXT) {
		count_global(GCNT_IPV6_EXT_DROPPED);
		return TC_ACT_SHOT;
	}
	if (rc != PARSE_OK) {
		count_global(GCNT_MALFORMED_DROPPED);
		return TC_ACT_SHOT;
	}
	pkt.len = skb->len;
	int v6 = pkt_is_v6(&pkt);
	if (v6) {
		if (ipv6_nd_passes(&pkt, hook == HOOK_FROM_WEP) ||
		    ipv6_host_nd_passes(&pkt, hook == HOOK_FROM_WEP)) {
			count_global(GCNT_IPV6_ND_PASSED);
			return TC_ACT_OK;
		}
		if (ipv6_disabled()) {
			count_global(GCNT_IPV6_DROPPED);
			return TC_ACT_SHOT;
		}
		count_global(GCNT_IPV6_PACKETS);
	}
	if (pkt.flags & PKT_F_FRAGMENT)
		count_global(GCNT_FRAGMENTS);

	__u32 ifindex = skb->ifindex;
	struct endpoint_value *ep = lookup_endpoint(ifindex);
	if (!ep) {
		count_global(GCNT_NO_ENDPOINT_DROPPED);
		return TC_ACT_SHOT;
	}
	__u32 endpoint_id = ep->endpoint_id;
	if (ep->flags & EP_F_ADMIN_DOWN) {
		count_global(GCNT_ADMIN_DOWN_DROPPED);
		count_endpoint(endpoint_id, hook, 0, pkt.len);
		return TC_ACT_SHOT;
	}

	if (hook == HOOK_FROM_WEP && !wep_source_allowed(ifindex, &pkt)) {
		count_global(GCNT_SPOOFED_DROPPED);
		count_spoofed(endpoint_id, pkt.len);
		return TC_ACT_SHOT;
	}
	if (hook == HOOK_FROM_WEP && tunnel_from_wep_dropped(&pkt)) {
		count_global(GCNT_TUNNEL_FROM_WEP_DROPPED);
		count_endpoint(endpoint_id, hook, 0, pkt.len);
		return TC_ACT_SHOT;
	}

	__u64 now = ct_now_ns();
	if (hook == HOOK_FROM_WEP) { /* service NAT before conntrack, policy */
		int nat = v6 ? nat6_from_wep(skb, &pkt, ifindex, now)
			     : nat_from_wep(skb, &pkt, ifindex, now);
		if (nat != NAT_CONTINUE)
			return nat;
	}
	__u32 ct_if = nat_ct_ifindex(skb, &pkt, ifindex, hook);
	int reply = 0;
	int hit = ct_lookup_update(&pkt, ct_if, hook, now, &reply);
	if (hit) {
		count_global(GCNT_CT_HIT);
		count_endpoint(endpoint_id, hook, 1, pkt.len);
		if (hit == CT_HIT_SVC_NAT && hook == HOOK_TO_WEP)
			return v6 ? nat6_rev_to_wep(skb, &pkt, now) : nat_rev_to_wep(skb, &pkt, now);
		if (hit == CT_HIT_SVC_NAT) { /* a backend's reply to a NodePort client */
			int nat = v6 ? nat6_rev_from_wep(skb, &pkt, now)
				     : nat_rev_from_wep(skb, &pkt, now);
			if (nat != NAT_CONTINUE)
				return nat;
		}
		int verdict = nat_hairpin_verdict(skb, &pkt, TC_ACT_OK);
		return hook == HOOK_FROM_WEP ? fastpath_verdict(skb, &pkt, verdict, reply)
					     : verdict;
	}
	if (ct_is_related(&pkt, ifindex, now)) {
		count_global(GCNT_CT_RELATED);
		count_endpoint(endpoint_id, hook, 1, pkt.len);
		if (hook != HOOK_TO_WEP)
			return TC_ACT_OK;
		return v6 ? nat6_rev_icmp_to_wep(skb, &pkt) : nat_rev_icmp_to_wep(skb, &pkt);
	}

	if (hook == HOOK_TO_WEP) { /* a NodePort flow's first packet: track it as one */
		if (v6)
			nat6_mark_nodeport(&pkt);
		else
			nat_mark_nodeport(&pkt);
	}
	__u32 zero = 0;
	struct policy_state *st = policy_scratch.lookup(&zero);
	if (!st)
		return TC_ACT_SHOT;
	__builtin_memcpy(&st->pkt, &pkt, sizeof(pkt));
	st->ifindex = ct_if;
	st->endpoint_id = endpoint_id;
	st->hook = hook;
	st->trace = skb->mark == PF_MARK_TRACE;
	st->decision = PD_NONE;
	st->counter_id = 0;
	st->idx = 0;
	st->tail_calls = 0;
	if (hook == HOOK_TO_WEP) {
		st->chain_start = ep->ingress_start;
		st->chain_len = ep->ingress_len;
	} else {
		st->chain_start = ep->egress_start;
		st->chain_len = ep->egress_len;
	}
	policy_progs.call(skb, PROG_IDX_POLICY);
	count_global(GCNT_TAIL_CALL_FAILED);
	count_endpoint(endpoint_id, hook, 0, pkt.len);
	return TC_ACT_SHOT;
}

int calico_from_wep(struct __sk_buff *skb)
{
	return policy_entry(skb, HOOK_FROM_WEP);
}

int calico_to_wep(struct __sk_buff *skb)
{
	return policy_entry(skb, HOOK_TO_WEP);
}

/* The route back to the source of a packet that arrived on ifindex: does it exist (Loose),
 * and does it leave by the same interface (Strict)? A source that is one of this host's
 * addresses (NOT_FWDED), blackholed or unreachable fails both. */
PF_INLINE int hep_source_ok(struct __sk_buff *skb, struct pkt_info *pkt, __u32 mode)
{
	struct bpf_fib_lookup fib = {};
	fib.family = 2; /* AF_INET */
	fib.l4_protocol = pkt->proto;
	fib.tot_len = 0; /* the kernel checks the MTU against this skb: FRAG_NEEDED still routes */
	fib.ipv4_src = pkt->daddr;
	fib.ipv4_dst = pkt->saddr;
	fib.ifindex = skb->ifindex; /* tc ingress: the arrival interface */
	int rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH &&
	    rc != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return 0;
	return mode == CFG_RPF_LOOSE || fib.ifindex == skb->ifindex;
}

/* NodePorts (nat.h, nat6.h) of a parsed packet from a host interface: the NAT's verdict, or
 * TC_ACT_OK (not NodePort traffic: the host's stack and iptables judge it, as before).
 * rpf_mode: IPv6's check (nat6_source_ok) for calico_from_hep, CFG_RPF_DISABLED otherwise. */
PF_INLINE int host_nodeport_verdict(struct __sk_buff *skb, struct pkt_info *pkt,
				    __u32 rpf_mode)
{
	pkt->len = skb->len;
	int nat = pkt_is_v6(pkt) ? nat6_from_host(skb, pkt, ct_now_ns(), rpf_mode)
				 : nat_from_host(skb, pkt, ct_now_ns());
	return nat == NAT_CONTINUE ? TC_ACT_OK : nat;
}

int calico_from_hep(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct pkt_info pkt = {};
	if (parse_packet(data, data_end, &pkt) != PARSE_OK)
		return TC_ACT_OK; /* not IP or malformed: the host's own stack and iptables judge */
	__u32 zero = 0;
	struct config_value *cfg = config.lookup(&zero);
	__u32 mode = cfg ? (cfg->flags & CFG_RPF_MASK) : CFG_RPF_STRICT;
	if (!pkt_is_v6(&pkt)) { /* IPv6: RPF only for what the NAT translates (nat6.h) */
		if (mode != CFG_RPF_DISABLED && !hep_source_ok(skb, &pkt, mode)) {
			count_global(GCNT_HEP_RPF_DROPPED);
			return TC_ACT_SHOT;
		}
		mode = CFG_RPF_DISABLED; /* checked */
	}
	return host_nodeport_verdict(skb, &pkt, mode); /* one call site: inlined once */
}

/* calico_from_host: tc INGRESS of the node's data interfaces that are not a host endpoint's
 * (BPFDataIfacePattern), while NodePort frontends exist: NodePorts only (nat.h, nat6.h),
 * everything else passes exactly as with no program. */
int calico_from_host(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct pkt_info pkt = {};
	if (parse_packet(data, data_end, &pkt) != PARSE_OK)
		return TC_ACT_OK;
	return host_nodeport_verdict(skb, &pkt, CFG_RPF_DISABLED);
}
