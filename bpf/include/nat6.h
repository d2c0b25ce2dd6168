/* nat6.h: Kubernetes Services over IPv6 in the tc programs (ClusterIP, external IPs).
 *
 * Maps (kept apart from IPv4's, as Calico's BPF mode keeps its v6 NAT maps): nat_frontend6.h
 * (VIP, port, proto -> service id, count, flags), nat_backend6.h (service id, index ->
 * backend), nat_affinity6.h (ClientIP affinity), nat_ct6.h (each flow's translation, both
 * ways); counters are nat_counters.h's, shared with IPv4.
 *
 * The same flow as nat.h's IPv4 path, for IPv6 packets:
 *   calico_from_wep calls nat6_from_wep() after the source check and BEFORE conntrack and
 *   policy, so the pod's egress policy sees the chosen backend and the backend's ingress
 *   policy sees the client:
 *   - not TCP/UDP with ports, or no nat_frontend6 entry for (daddr, dport, proto): nothing
 *     (there is no VIP pre-filter: one hash lookup per IPv6 TCP/UDP packet from a pod);
 *   - a usable nat_ct6 FWD entry (nat_ct_usable): its backend;
 *   - else a new flow: count == 0 -> REJECT (ICMPv6 port unreachable, below); ClientIP
 *     affinity (nat_affinity6) while fresh; else a random index of [0, count); FWD and REV
 *     entries written; destination address and port rewritten.
 *   calico_to_wep calls nat6_rev_to_wep() for conntrack hits of service flows
 *   (CT_HIT_SVC_NAT): the REV entry puts (VIP, service port) back as the reply's source.
 * Checksums: IPv6 has no header checksum; the TCP/UDP checksum covers the addresses through
 * the pseudo-header, so an address change is one bpf_csum_diff of the 16-byte words fed to
 * bpf_l4_csum_replace as a pseudo-header difference, a port change a 2-byte replace.
 * Only packets whose L4 header directly follows the fixed IPv6 header are translated; a
 * packet to a VIP with extension headers drops (NAT_CNT_XLATE_FAILED).
 * HAIRPIN (a pod reaching itself through its Service) as nat.h does it: the forward
 * direction is also source-NATed to the VIP and sent back out of the interface
 * (nat_hairpin_verdict, family-neutral), the pod's reply is recognised by the REV entry
 * keyed by the VIP (nat6_hairpin_reply), and calico_to_wep restores VIP:vport -> pod:cport.
 *
 * REJECT: the packet becomes an ICMPv6 destination unreachable, code 4 (port unreachable),
 * from the VIP to the client, quoting the first 48 bytes of the original (its IPv6 header
 * and 8 bytes of L4), MACs swapped, redirected back out of the pod's interface; a conntrack
 * entry for the original tuple is created first so calico_to_wep passes it as related.
 *
 * Stack: calico_from_wep's frame already holds the packet and the IPv4 NAT's locals; the
 * IPv6 NAT's keys, values and the reject's headers live in the per-CPU nat6_scratch map
 * (private to one build, like policy_scratch), keeping the frame under 512 bytes.
 *
 * ICMPv6 errors about a service flow (a backend's port unreachable) are passed to the
 * client as related by conntrack and translated back by nat6_rev_icmp_to_wep.
 *
 * NODEPORTS over IPv6 (nat6_from_host; calico_from_host on data interfaces, calico_from_hep
 * on host endpoint interfaces), nat.h's design for IPv6 packets: frontends [::]:nodePort in
 * nat_frontend6 (NAT_FE_F_NODEPORT; the calc graph gives a Service one when it has an IPv6
 * cluster IP, backends its IPv6 endpoints, externalTrafficPolicy Local: this node's only).
 * A TCP/UDP packet arriving on a host interface whose (port, proto) has such a frontend and
 * whose destination is one of this node's addresses (the routes map's RT_F_LOCAL_HOST, as
 * for IPv4: the agent writes every address of the host's interfaces there, so any of the
 * node's IPv6 addresses serves; a destination the map does not know as this host's, even
 * one the host would not route at all, is not translated):
 *   - later packets: the nat_ct6 FWD entry flagged NAT_CT_F_NODEPORT;
 *   - a new flow: count == 0 -> ICMPv6 port unreachable back out of the interface
 *     (nat6_reject); else affinity / a random backend;
 *   - backend on this node (routes map: RT_F_LOCAL_WORKLOAD): DNAT only, the client's
 *     address kept, on through the host's stack to the pod, whose calico_to_wep polices the
 *     real client and marks the flow (nat6_mark_nodeport) so the backend's replies get
 *     nat6_rev_from_wep at calico_from_wep: source back to (node address, node port), sent
 *     by FIB lookup + bpf_redirect_neigh (nat6_fib_redirect);
 *   - backend on another node: DNAT and SNAT to the node address the client used (port:
 *     the client's own when free, else random ones in [NAT_SNAT_PORT_MIN, 65535], never a
 *     NodePort's number), sent by nat6_fib_redirect; the backend's replies, addressed to
 *     (node address, SNAT port), are recognised by their NAT_CT_F_SNAT REV entry (no
 *     frontend has their port) and sent back to the client from (node address, node port).
 * At calico_from_hep the packets translated here (new flows, later packets, SNAT replies)
 * first pass BPFEnforceRPF's check for IPv6 (nat6_source_ok; failing: dropped, counted as
 * IPv4's); other IPv6 traffic at a host endpoint passes unchecked, as before.
 * Hop limits are not decremented (as IPv4's TTL on this path).
 */
#ifndef PYFELIX_NAT6_H
#define PYFELIX_NAT6_H

#include "common.h"
#include "conntrack.h"
#include "nat.h"
#include "nat_frontend6.h"
#include "nat_backend6.h"
#include "nat_affinity6.h"
#include "nat_ct6.h"
#include "nat_counters.h"
#include "counters.h"
#include "config.h"
#include "routes.h"

#define PF_IP6_NEXTHDR_OFF (PF_ETH_HLEN + 6)
#define PF_IP6_SRC_OFF (PF_ETH_HLEN + 8)
#define PF_IP6_DST_OFF (PF_ETH_HLEN + 24)
#define PF_IP6_L4_OFF (PF_ETH_HLEN + 40)

PF_INLINE int nat6_addr_eq(const struct pf_addr *a, const struct pf_addr *b)
{
	return ((a->w[0] ^ b->w[0]) | (a->w[1] ^ b->w[1]) | (a->w[2] ^ b->w[2]) |
		(a->w[3] ^ b->w[3])) == 0;
}

struct nat6_icmp_reply {
	struct ipv6hdr ip;
	struct pf_icmp_hdr icmp;
	__u8 orig[48]; /* the original IPv6 header and 8 bytes of what follows it */
};

struct nat6_pseudo_hdr {
	struct pf_addr src;
	struct pf_addr dst;
	__be32 len;
	__u8 zero[3];
	__u8 next;
};

/* One packet's IPv6 NAT temporaries (see "Stack" above); every use sets what it reads. */
struct nat6_scratch {
	struct nat_fe6_key fk;
	struct nat_ct6_key ck;
	struct nat_ct6_key rk;
	struct nat_ct6_value fwd;
	struct nat_ct6_value rev;
	struct nat_aff6_key ak;
	struct nat_aff6_value nav;
	struct pf_addr be_addr;
	struct pf_addr old_addr;
	struct pf_addr to_addr;
	struct pf_addr vip; /* hairpin: the VIP (forward: the new source) or the pod (reply) */
	struct pf_addr client; /* NodePorts: the client (SNAT reply: its peer) */
	struct bpf_fib_lookup fib;
	struct nat6_pseudo_hdr ph;
	struct ethhdr eth;
	struct ethhdr out;
	__u8 pad[4];
	struct nat6_icmp_reply reply;
};

BPF_TABLE_PINNED("percpu_array", __u32, struct nat6_scratch, nat6_scratch, 1,
		 PIN_DIR "/nat6scratch_" PROG_ABI);

/* Rewrite the destination (is_dst) or source address (to sc->to_addr) and port of an IPv6
 * packet, keeping the TCP/UDP checksum right; pkt follows. Returns 0, or -1 (caller drops). */
PF_INLINE int nat6_rewrite(struct __sk_buff *skb, struct pkt_info *pkt, int is_dst,
			   struct nat6_scratch *sc, __u16 new_port)
{
	__u8 nexthdr = 0;
	if (bpf_skb_load_bytes(skb, PF_IP6_NEXTHDR_OFF, &nexthdr, 1) || nexthdr != pkt->proto)
		return -1; /* extension headers: not translated */
	__builtin_memcpy(&sc->old_addr, is_dst ? &pkt->dst : &pkt->src, sizeof(sc->old_addr));
	__u16 old_port = is_dst ? pkt->dport : pkt->sport;
	__u32 csum_off = 0;
	__u64 mangled = 0;
	if (pkt->proto == PF_IPPROTO_TCP) {
		csum_off = PF_IP6_L4_OFF + 16;
	} else if (pkt->proto == PF_IPPROTO_UDP) {
		csum_off = PF_IP6_L4_OFF + 6;
		mangled = BPF_F_MARK_MANGLED_0;
	} else if (old_port != new_port) {
		return -1;
	}
	if (!nat6_addr_eq(&sc->old_addr, &sc->to_addr)) {
		if (csum_off) {
			__s64 diff = bpf_csum_diff((__be32 *)&sc->old_addr, sizeof(sc->old_addr),
						   (__be32 *)&sc->to_addr, sizeof(sc->to_addr), 0);
			if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff,
							    BPF_F_PSEUDO_HDR | mangled))
				return -1;
		}
		if (bpf_skb_store_bytes(skb, is_dst ? PF_IP6_DST_OFF : PF_IP6_SRC_OFF, &sc->to_addr,
					sizeof(sc->to_addr), 0))
			return -1;
	}
	if (old_port != new_port) {
		__be16 from = pf_htons(old_port), to = pf_htons(new_port);
		if (bpf_l4_csum_replace(skb, csum_off, from, to, mangled | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, PF_IP6_L4_OFF + (is_dst ? 2 : 0), &to, 2, 0))
			return -1;
	}
	if (is_dst) {
		__builtin_memcpy(&pkt->dst, &sc->to_addr, sizeof(pkt->dst));
		pkt->dport = new_port;
	} else {
		__builtin_memcpy(&pkt->src, &sc->to_addr, sizeof(pkt->src));
		pkt->sport = new_port;
	}
	return 0;
}

/* Turn the packet into an ICMPv6 port unreachable from its destination back to its source
 * and send it out of ifindex (towards the pod). Returns the tc verdict. */
PF_INLINE int nat6_reject(struct __sk_buff *skb, struct pkt_info *pkt, __u32 ifindex,
			  __u64 now, struct nat6_scratch *sc)
{
	struct nat6_icmp_reply *r = &sc->reply;
	__builtin_memset(r, 0, sizeof(*r));
	if (bpf_skb_load_bytes(skb, 0, &sc->eth, sizeof(sc->eth)) ||
	    bpf_skb_load_bytes(skb, PF_ETH_HLEN, r->orig, sizeof(r->orig))) {
		count_nat(NAT_CNT_REJECT_FAILED);
		return TC_ACT_SHOT;
	}
	r->ip.version = 6;
	r->ip.payload_len = pf_htons((__u16)(sizeof(r->icmp) + sizeof(r->orig)));
	r->ip.nexthdr = PF_IPPROTO_ICMPV6;
	r->ip.hop_limit = 64;
	__builtin_memcpy(&r->ip.saddr, &pkt->dst, 16);
	__builtin_memcpy(&r->ip.daddr, &pkt->src, 16);
	r->icmp.type = 1; /* destination unreachable */
	r->icmp.code = 4; /* port unreachable: what kube-proxy's REJECT sends */
	struct nat6_pseudo_hdr *ph = &sc->ph;
	__builtin_memset(ph, 0, sizeof(*ph));
	__builtin_memcpy(&ph->src, &pkt->dst, 16);
	__builtin_memcpy(&ph->dst, &pkt->src, 16);
	ph->len = __builtin_bswap32((__u32)(sizeof(r->icmp) + sizeof(r->orig)));
	ph->next = PF_IPPROTO_ICMPV6;
	__s64 sum = bpf_csum_diff(0, 0, (__be32 *)ph, sizeof(*ph), 0);
	if (sum >= 0)
		sum = bpf_csum_diff(0, 0, (__be32 *)&r->icmp, sizeof(r->icmp) + sizeof(r->orig),
				    (__u32)sum);
	r->icmp.checksum = nat_csum_fold(sum);
	__builtin_memcpy(sc->out.h_dest, sc->eth.h_source, ETH_ALEN);
	__builtin_memcpy(sc->out.h_source, sc->eth.h_dest, ETH_ALEN);
	sc->out.h_proto = sc->eth.h_proto;
	if (sum < 0 || bpf_skb_change_tail(skb, PF_ETH_HLEN + sizeof(*r), 0) ||
	    bpf_skb_store_bytes(skb, 0, &sc->out, sizeof(sc->out), 0) ||
	    bpf_skb_store_bytes(skb, PF_ETH_HLEN, r, sizeof(*r), 0)) {
		count_nat(NAT_CNT_REJECT_FAILED);
		return TC_ACT_SHOT;
	}
	ct_create(pkt, ifindex, HOOK_FROM_WEP, now, 0); /* the error is related at to_wep */
	count_nat(NAT_CNT_REJECTED);
	return bpf_redirect(ifindex, 0);
}

/* A new flow's backend (fe->count > 0) into sc->be_addr / *be_port: the client's affinity
 * backend while fresh, else a random index, recorded as the client's affinity. 0, or -1
 * when the index is missing (between two writes of an update: the caller drops). */
PF_INLINE int nat6_choose_backend(struct nat_fe6_value *fe, struct pkt_info *pkt, __u64 now,
				  struct nat6_scratch *sc, __u16 *be_port)
{
	struct nat_aff6_key *ak = &sc->ak;
	__builtin_memset(ak, 0, sizeof(*ak));
	ak->service_id = fe->service_id;
	__builtin_memcpy(&ak->client, &pkt->src, sizeof(ak->client));
	if (fe->flags & NAT_FE_F_AFFINITY) {
		struct nat_aff6_value *av = nat_affinity6.lookup(ak);
		__u64 timeout = (__u64)fe->affinity_timeout * CT_NS_PER_S;
		if (av && !(now > av->last_used_ns && now - av->last_used_ns > timeout)) {
			__builtin_memcpy(&sc->be_addr, &av->addr, sizeof(sc->be_addr));
			*be_port = av->port;
			av->last_used_ns = now;
			count_nat(NAT_CNT_AFFINITY_HIT);
			return 0;
		}
	}
	struct nat_be_key bk = {};
	bk.service_id = fe->service_id;
	bk.index = bpf_get_prandom_u32() % fe->count;
	struct nat_be6_value *be = nat_backend6.lookup(&bk);
	if (!be) {
		count_nat(NAT_CNT_NO_BACKEND);
		return -1;
	}
	__builtin_memcpy(&sc->be_addr, &be->addr, sizeof(sc->be_addr));
	*be_port = be->port;
	if (fe->flags & NAT_FE_F_AFFINITY) {
		struct nat_aff6_value *nav = &sc->nav;
		__builtin_memset(nav, 0, sizeof(*nav));
		__builtin_memcpy(&nav->addr, &be->addr, sizeof(nav->addr));
		nav->port = be->port;
		nav->last_used_ns = now;
		nat_affinity6.update(ak, nav);
	}
	return 0;
}

/* A nat_ct6 key of the packet's own tuple. */
PF_INLINE void nat6_pkt_key(struct nat_ct6_key *k, struct pkt_info *pkt, __u8 kind)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(&k->saddr, &pkt->src, sizeof(k->saddr));
	__builtin_memcpy(&k->daddr, &pkt->dst, sizeof(k->daddr));
	k->sport = pkt->sport;
	k->dport = pkt->dport;
	k->proto = pkt->proto;
	k->kind = kind;
}

/* nat_ct_usable (nat.h) for an IPv6 entry: idle within the protocol's timeout, and not a
 * TCP SYN reusing an old tuple. */
PF_INLINE int nat6_ct_usable(struct nat_ct6_value *v, struct pkt_info *pkt, __u64 now)
{
	if (now > v->last_seen_ns && now - v->last_seen_ns > nat_idle_ns(pkt->proto))
		return 0;
	if (pkt->proto == PF_IPPROTO_TCP &&
	    (pkt->tcp_flags & (PF_TCP_SYN | PF_TCP_ACK)) == PF_TCP_SYN &&
	    now > v->created_ns && now - v->created_ns > CT_TIMEOUT_TCP_SYN * CT_NS_PER_S)
		return 0;
	return 1;
}

/* nat_hairpin_reply (nat.h) for IPv6: a pod's packet to a VIP that no frontend port
 * matches, the reply of a hairpin flow (pod:backend port -> VIP:client port)? Only marked. */
PF_INLINE int nat6_hairpin_reply(struct pkt_info *pkt, struct nat6_scratch *sc)
{
	struct nat_ct6_key *rk = &sc->rk;
	nat6_pkt_key(rk, pkt, NAT_CT_REV);
	struct nat_ct6_value *v = nat_ct6.lookup(rk);
	if (v && (v->flags & NAT_CT_F_HAIRPIN))
		pkt->flags |= PKT_F_HAIRPIN_REPLY;
	return NAT_CONTINUE;
}

/* The service NAT of an IPv6 packet from a pod (see the top of this file). Returns
 * NAT_CONTINUE (translated or not a service flow) or a tc verdict. */
PF_INLINE int nat6_from_wep(struct __sk_buff *skb, struct pkt_info *pkt, __u32 ifindex,
			    __u64 now)
{
	if (!(pkt->flags & PKT_F_PORTS))
		return NAT_CONTINUE;
	__u32 zero = 0;
	struct nat6_scratch *sc = nat6_scratch.lookup(&zero);
	if (!sc)
		return TC_ACT_SHOT;
	struct nat_fe6_key *fk = &sc->fk;
	__builtin_memset(fk, 0, sizeof(*fk));
	__builtin_memcpy(&fk->addr, &pkt->dst, sizeof(fk->addr));
	fk->port = pkt->dport;
	fk->proto = pkt->proto;
	struct nat_fe6_value *fe = nat_frontend6.lookup(fk);
	if (!fe)
		return nat6_hairpin_reply(pkt, sc);

	struct nat_ct6_key *ck = &sc->ck;
	nat6_pkt_key(ck, pkt, NAT_CT_FWD);
	__u16 be_port = 0;
	__u16 hairpin = 0;
	struct nat_ct6_value *cv = nat_ct6.lookup(ck);
	if (cv && nat6_ct_usable(cv, pkt, now)) {
		__builtin_memcpy(&sc->be_addr, &cv->addr, sizeof(sc->be_addr));
		be_port = cv->port;
		hairpin = cv->flags & NAT_CT_F_HAIRPIN;
		cv->last_seen_ns = now;
		count_nat(NAT_CNT_CT_HIT);
	} else {
		if (fe->count == 0)
			return nat6_reject(skb, pkt, ifindex, now, sc);
		if (nat6_choose_backend(fe, pkt, now, sc, &be_port))
			return TC_ACT_SHOT;
		hairpin = nat6_addr_eq(&sc->be_addr, &pkt->src) ? NAT_CT_F_HAIRPIN : 0;
		struct nat_ct6_value *fwd = &sc->fwd;
		__builtin_memset(fwd, 0, sizeof(*fwd));
		__builtin_memcpy(&fwd->addr, &sc->be_addr, sizeof(fwd->addr));
		fwd->port = be_port;
		fwd->flags = hairpin;
		fwd->created_ns = now;
		fwd->last_seen_ns = now;
		nat_ct6.update(ck, fwd);
		struct nat_ct6_key *rk = &sc->rk;
		__builtin_memset(rk, 0, sizeof(*rk));
		__builtin_memcpy(&rk->saddr, &sc->be_addr, sizeof(rk->saddr));
		/* hairpin: the pod replies to the VIP it sees as the source */
		__builtin_memcpy(&rk->daddr, hairpin ? &pkt->dst : &pkt->src, sizeof(rk->daddr));
		rk->sport = be_port;
		rk->dport = pkt->sport;
		rk->proto = pkt->proto;
		rk->kind = NAT_CT_REV;
		struct nat_ct6_value *rev = &sc->rev;
		__builtin_memset(rev, 0, sizeof(*rev));
		__builtin_memcpy(&rev->addr, &pkt->dst, sizeof(rev->addr));
		rev->port = pkt->dport;
		rev->flags = hairpin;
		rev->created_ns = now;
		rev->last_seen_ns = now;
		nat_ct6.update(rk, rev);
		count_nat(NAT_CNT_NEW_FLOWS);
	}
	__builtin_memcpy(&sc->vip, &pkt->dst, sizeof(sc->vip));
	__builtin_memcpy(&sc->to_addr, &sc->be_addr, sizeof(sc->to_addr));
	if (nat6_rewrite(skb, pkt, 1, sc, be_port)) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	if (hairpin) { /* also from the VIP (client port kept): the pod cannot reach itself */
		__builtin_memcpy(&sc->to_addr, &sc->vip, sizeof(sc->to_addr));
		if (nat6_rewrite(skb, pkt, 0, sc, pkt->sport)) {
			count_nat(NAT_CNT_XLATE_FAILED);
			return TC_ACT_SHOT;
		}
	}
	/* conntrack marks the flow: its replies are looked up */
	pkt->flags |= PKT_F_SVC_NAT | (hairpin ? PKT_F_HAIRPIN : 0);
	return NAT_CONTINUE;
}

/* A reply to an IPv6 service flow on its way to the client pod: source back to the VIP.
 * Returns the tc verdict (TC_ACT_OK, or TC_ACT_SHOT when the rewrite failed). */
PF_INLINE int nat6_rev_to_wep(struct __sk_buff *skb, struct pkt_info *pkt, __u64 now)
{
	if (!(pkt->flags & PKT_F_PORTS))
		return TC_ACT_OK;
	__u32 zero = 0;
	struct nat6_scratch *sc = nat6_scratch.lookup(&zero);
	if (!sc)
		return TC_ACT_SHOT;
	struct nat_ct6_key *rk = &sc->rk;
	nat6_pkt_key(rk, pkt, NAT_CT_REV);
	struct nat_ct6_value *rv = nat_ct6.lookup(rk);
	if (!rv)
		return TC_ACT_OK;
	rv->last_seen_ns = now;
	__u16 hairpin = rv->flags & NAT_CT_F_HAIRPIN;
	__builtin_memcpy(&sc->vip, &pkt->src, sizeof(sc->vip)); /* the backend: the pod */
	__builtin_memcpy(&sc->to_addr, &rv->addr, sizeof(sc->to_addr));
	if (nat6_rewrite(skb, pkt, 0, sc, rv->port)) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	if (hairpin) { /* the pod's own reply: back to its own address, not the VIP */
		__builtin_memcpy(&sc->to_addr, &sc->vip, sizeof(sc->to_addr));
		if (nat6_rewrite(skb, pkt, 1, sc, pkt->dport)) {
			count_nat(NAT_CNT_XLATE_FAILED);
			return TC_ACT_SHOT;
		}
	}
	count_nat(NAT_CNT_REPLIES);
	return TC_ACT_OK;
}

/* nat_rev_icmp_to_wep (nat.h) for IPv6: an ICMPv6 error about a service flow on its way
 * to the client pod (conntrack found it related) quotes client -> backend:port; the
 * client's socket knows the VIP. The VIP goes back as the quoted destination (address and
 * port) and, when the backend sent the error, as its source. IPv6 has no header checksum:
 * only the ICMPv6 checksum is fixed (its pseudo-header covers the outer source; the quoted
 * L4 checksum is not checked by receivers). Only an error without extension headers whose
 * quote follows the fixed header directly is translated; others pass as they are.
 * Returns the tc verdict (TC_ACT_SHOT when a rewrite failed). */
PF_INLINE int nat6_rev_icmp_to_wep(struct __sk_buff *skb, struct pkt_info *pkt)
{
	if (pkt->inner_proto != PF_IPPROTO_TCP && pkt->inner_proto != PF_IPPROTO_UDP)
		return TC_ACT_OK;
	__u8 nexthdr = 0, inner_next = 0;
	if (bpf_skb_load_bytes(skb, PF_IP6_NEXTHDR_OFF, &nexthdr, 1) ||
	    nexthdr != PF_IPPROTO_ICMPV6 ||
	    bpf_skb_load_bytes(skb, PF_IP6_L4_OFF + 8 + 6, &inner_next, 1) ||
	    inner_next != pkt->inner_proto)
		return TC_ACT_OK;
	__u32 zero = 0;
	struct nat6_scratch *sc = nat6_scratch.lookup(&zero);
	if (!sc)
		return TC_ACT_SHOT;
	struct nat_ct6_key *rk = &sc->rk;
	__builtin_memset(rk, 0, sizeof(*rk));
	__builtin_memcpy(&rk->saddr, &pkt->inner_dst, sizeof(rk->saddr));
	__builtin_memcpy(&rk->daddr, &pkt->inner_src, sizeof(rk->daddr));
	rk->sport = pkt->inner_dport;
	rk->dport = pkt->inner_sport;
	rk->proto = pkt->inner_proto;
	rk->kind = NAT_CT_REV;
	struct nat_ct6_value *rv = nat_ct6.lookup(rk);
	if (!rv || (rv->flags & NAT_CT_F_HAIRPIN))
		return TC_ACT_OK;
	__u32 csum_off = PF_IP6_L4_OFF + 2;
	__u32 inner_off = PF_IP6_L4_OFF + 8;
	__builtin_memcpy(&sc->old_addr, &pkt->inner_dst, sizeof(sc->old_addr)); /* backend */
	__builtin_memcpy(&sc->to_addr, &rv->addr, sizeof(sc->to_addr));         /* VIP */
	__be16 old_port = pf_htons(pkt->inner_dport), vport = pf_htons(rv->port);
	__s64 diff = bpf_csum_diff((__be32 *)&sc->old_addr, sizeof(sc->old_addr),
				   (__be32 *)&sc->to_addr, sizeof(sc->to_addr), 0);
	if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff, 0) ||
	    bpf_skb_store_bytes(skb, inner_off + 24, &sc->to_addr, sizeof(sc->to_addr), 0) ||
	    bpf_l4_csum_replace(skb, csum_off, old_port, vport, 2) ||
	    bpf_skb_store_bytes(skb, inner_off + 40 + 2, &vport, 2, 0))
		goto fail;
	if (nat6_addr_eq(&pkt->src, &sc->old_addr) &&
	    (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR) ||
	     bpf_skb_store_bytes(skb, PF_IP6_SRC_OFF, &sc->to_addr, sizeof(sc->to_addr), 0)))
		goto fail;
	count_nat(NAT_CNT_REPLIES);
	return TC_ACT_OK;
fail:
	count_nat(NAT_CNT_XLATE_FAILED);
	return TC_ACT_SHOT;
}

/* ---- NodePorts over IPv6 (see the top of this file) ---- */

#define PF_AF_INET6 10

/* A FIB lookup (IPv6) from src to dst as if arriving on the packet's interface, into
 * sc->fib. Returns BPF_FIB_LKUP_RET_*. */
PF_INLINE int nat6_fib(struct __sk_buff *skb, struct nat6_scratch *sc,
		       const struct pf_addr *src, const struct pf_addr *dst, __u8 proto)
{
	struct bpf_fib_lookup *fib = &sc->fib;
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = PF_AF_INET6;
	fib->l4_protocol = proto;
	__builtin_memcpy(fib->ipv6_src, src, 16);
	__builtin_memcpy(fib->ipv6_dst, dst, 16);
	fib->ifindex = skb->ifindex;
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/* nat_fib_redirect (nat.h) for IPv6: the translated packet goes out of the interface of its
 * route, the next hop's MAC found by bpf_redirect_neigh (no route: drop). */
PF_INLINE int nat6_fib_redirect(struct __sk_buff *skb, struct pkt_info *pkt,
				struct nat6_scratch *sc)
{
	int rc = nat6_fib(skb, sc, &pkt->src, &pkt->dst, pkt->proto);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		count_nat(NAT_CNT_NO_ROUTE);
		return TC_ACT_SHOT;
	}
	return pf_redirect_neigh(sc->fib.ifindex, NULL, 0, 0);
}

/* BPFEnforceRPF for an IPv6 packet translated at a host endpoint: the route back to its
 * source exists (Loose) and leaves by the arrival interface (Strict). */
PF_INLINE int nat6_source_ok(struct __sk_buff *skb, struct pkt_info *pkt,
			     struct nat6_scratch *sc, __u32 rpf_mode)
{
	if (rpf_mode == CFG_RPF_DISABLED)
		return 1;
	int rc = nat6_fib(skb, sc, &pkt->dst, &pkt->src, pkt->proto);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH &&
	    rc != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return 0;
	return rpf_mode == CFG_RPF_LOOSE || sc->fib.ifindex == skb->ifindex;
}

/* The routes map's flags for an IPv6 address (0: no route). */
PF_INLINE __u32 nat6_route_flags(const struct pf_addr *addr)
{
	struct route_key key = {};
	key.prefixlen = ROUTE_KEY_FIXED_BITS + 128;
	key.family = 6;
	__builtin_memcpy(&key.addr, addr, sizeof(key.addr));
	struct route_value *v = routes.lookup(&key);
	return v ? v->flags : 0;
}

/* nat_snat_port (nat.h) for IPv6: the client's port unless another live flow holds
 * (backend, node address, backend port, port) or it is a NodePort's number, else random
 * ones. The backend is sc->be_addr. Returns the port, or 0 when every try is taken. */
PF_INLINE __u16 nat6_snat_port(struct pkt_info *pkt, __u16 be_port, __u64 now,
			       struct nat6_scratch *sc)
{
	struct nat_ct6_key *rk = &sc->rk;
	__builtin_memset(rk, 0, sizeof(*rk));
	__builtin_memcpy(&rk->saddr, &sc->be_addr, sizeof(rk->saddr));
	__builtin_memcpy(&rk->daddr, &pkt->dst, sizeof(rk->daddr));
	rk->sport = be_port;
	rk->proto = pkt->proto;
	rk->kind = NAT_CT_REV;
	struct nat_fe6_key *fk = &sc->fk;
	__builtin_memset(fk, 0, sizeof(*fk));
	fk->proto = pkt->proto;
	for (int i = 0; i < NAT_SNAT_TRIES; i++) {
		__u16 port = i == 0 ? pkt->sport
				    : NAT_SNAT_PORT_MIN + bpf_get_prandom_u32() % NAT_SNAT_PORT_SPAN;
		fk->port = port; /* never a NodePort's number */
		if (nat_frontend6.lookup(fk))
			continue;
		rk->dport = port;
		struct nat_ct6_value *taken = nat_ct6.lookup(rk);
		if (!taken ||
		    (nat6_addr_eq(&taken->peer_addr, &pkt->src) && taken->peer_port == pkt->sport) ||
		    (now > taken->last_seen_ns &&
		     now - taken->last_seen_ns > nat_idle_ns(pkt->proto)))
			return port;
	}
	return 0;
}

/* The NodePort NAT of an IPv6 packet arriving on a host interface (see the top of this
 * file); rpf_mode: calico_from_hep's CFG_RPF_*, CFG_RPF_DISABLED for calico_from_host.
 * Returns NAT_CONTINUE (not NodePort traffic: the interface's usual path) or a verdict.
 * One translation tail serves both directions (each inlined copy of nat6_rewrite and
 * nat6_fib costs the program hundreds of instructions): a client's packet gets the
 * backend as destination and, source-NATed, (node address, SNAT port) as source; a reply
 * to a source-NATed flow (nat_snat_reply in nat.h) gets the client as destination and
 * (node address, node port) as source. */
PF_INLINE int nat6_from_host(struct __sk_buff *skb, struct pkt_info *pkt, __u64 now,
			     __u32 rpf_mode)
{
	if (!(pkt->flags & PKT_F_PORTS))
		return NAT_CONTINUE;
	__u32 zero = 0;
	struct nat6_scratch *sc = nat6_scratch.lookup(&zero);
	if (!sc)
		return TC_ACT_SHOT;
	struct nat_fe6_key *fk = &sc->fk;
	__builtin_memset(fk, 0, sizeof(*fk)); /* address [::]: any of this node's */
	fk->port = pkt->dport;
	fk->proto = pkt->proto;
	struct nat_fe6_value *fe = nat_frontend6.lookup(fk);
	struct nat_ct6_value *rv = NULL;
	if (!fe) { /* a backend's reply to a flow source-NATed to this node? */
		nat6_pkt_key(&sc->rk, pkt, NAT_CT_REV);
		rv = nat_ct6.lookup(&sc->rk);
		if (!rv || !(rv->flags & NAT_CT_F_SNAT))
			return NAT_CONTINUE;
	} else if (!(nat6_route_flags(&pkt->dst) & RT_F_LOCAL_HOST)) {
		return NAT_CONTINUE; /* not to this node: forwarded traffic */
	}
	if (!nat6_source_ok(skb, pkt, sc, rpf_mode)) {
		count_global(GCNT_HEP_RPF_DROPPED);
		return TC_ACT_SHOT;
	}
	__u16 be_port = 0;  /* the new destination port (sc->be_addr: its address) */
	__u16 snat_port = 0; /* the new source port (sc->vip: its address); 0: source kept */
	if (rv) {
		rv->last_seen_ns = now;
		__builtin_memcpy(&sc->be_addr, &rv->peer_addr, sizeof(sc->be_addr)); /* client */
		be_port = rv->peer_port;
		__builtin_memcpy(&sc->vip, &rv->addr, sizeof(sc->vip)); /* the node's address */
		snat_port = rv->port;                                  /* the node port */
		count_nat(NAT_CNT_REPLIES);
		goto xlate;
	}

	struct nat_ct6_key *ck = &sc->ck;
	nat6_pkt_key(ck, pkt, NAT_CT_FWD);
	struct nat_ct6_value *cv = nat_ct6.lookup(ck);
	if (cv && (cv->flags & NAT_CT_F_NODEPORT) && nat6_ct_usable(cv, pkt, now)) {
		__builtin_memcpy(&sc->be_addr, &cv->addr, sizeof(sc->be_addr));
		be_port = cv->port;
		snat_port = (cv->flags & NAT_CT_F_SNAT) ? cv->peer_port : 0;
		cv->last_seen_ns = now;
		count_nat(NAT_CNT_CT_HIT);
	} else {
		if (fe->count == 0)
			return nat6_reject(skb, pkt, skb->ifindex, now, sc);
		if (nat6_choose_backend(fe, pkt, now, sc, &be_port))
			return TC_ACT_SHOT;
		__u16 flags = NAT_CT_F_NODEPORT;
		if (!(nat6_route_flags(&sc->be_addr) & RT_F_LOCAL_WORKLOAD)) {
			snat_port = nat6_snat_port(pkt, be_port, now, sc);
			if (!snat_port) {
				count_nat(NAT_CNT_SNAT_NO_PORT);
				return TC_ACT_SHOT;
			}
			flags |= NAT_CT_F_SNAT;
			count_nat(NAT_CNT_NODEPORT_SNAT);
		}
		struct nat_ct6_value *fwd = &sc->fwd;
		__builtin_memset(fwd, 0, sizeof(*fwd));
		__builtin_memcpy(&fwd->addr, &sc->be_addr, sizeof(fwd->addr));
		fwd->port = be_port;
		fwd->flags = flags;
		fwd->created_ns = now;
		fwd->last_seen_ns = now;
		if (snat_port) {
			__builtin_memcpy(&fwd->peer_addr, &pkt->dst, sizeof(fwd->peer_addr));
			fwd->peer_port = snat_port;
		}
		nat_ct6.update(ck, fwd);
		struct nat_ct6_key *rk = &sc->rk;
		__builtin_memset(rk, 0, sizeof(*rk));
		__builtin_memcpy(&rk->saddr, &sc->be_addr, sizeof(rk->saddr));
		__builtin_memcpy(&rk->daddr, snat_port ? &pkt->dst : &pkt->src, sizeof(rk->daddr));
		rk->sport = be_port;
		rk->dport = snat_port ? snat_port : pkt->sport;
		rk->proto = pkt->proto;
		rk->kind = NAT_CT_REV;
		struct nat_ct6_value *rev = &sc->rev;
		__builtin_memset(rev, 0, sizeof(*rev));
		__builtin_memcpy(&rev->addr, &pkt->dst, sizeof(rev->addr));
		rev->port = pkt->dport;
		rev->flags = flags;
		rev->created_ns = now;
		rev->last_seen_ns = now;
		__builtin_memcpy(&rev->peer_addr, &pkt->src, sizeof(rev->peer_addr));
		rev->peer_port = pkt->sport;
		nat_ct6.update(rk, rev);
		count_nat(NAT_CNT_NEW_FLOWS);
		count_nat(NAT_CNT_NODEPORT_NEW);
	}
	__builtin_memcpy(&sc->vip, &pkt->dst, sizeof(sc->vip)); /* SNAT: the node's address */
xlate:
	__builtin_memcpy(&sc->to_addr, &sc->be_addr, sizeof(sc->to_addr));
	if (nat6_rewrite(skb, pkt, 1, sc, be_port))
		goto fail;
	if (!snat_port)
		return TC_ACT_OK; /* to the local backend through the stack: its to_wep polices it */
	__builtin_memcpy(&sc->to_addr, &sc->vip, sizeof(sc->to_addr));
	if (nat6_rewrite(skb, pkt, 0, sc, snat_port))
		goto fail;
	return nat6_fib_redirect(skb, pkt, sc);
fail:
	count_nat(NAT_CNT_XLATE_FAILED);
	return TC_ACT_SHOT;
}

/* nat_mark_nodeport (nat.h) for IPv6: calico_to_wep, first packet of a flow (conntrack
 * missed): an IPv6 NodePort flow DNATed at a host interface to this local backend? Then
 * conntrack marks it CT_F_SVC_NAT, so the backend's replies get nat6_rev_from_wep. */
PF_INLINE void nat6_mark_nodeport(struct pkt_info *pkt)
{
	if (!(pkt->flags & PKT_F_PORTS))
		return;
	__u32 zero = 0;
	struct nat6_scratch *sc = nat6_scratch.lookup(&zero);
	if (!sc)
		return;
	struct nat_ct6_key *rk = &sc->rk;
	__builtin_memset(rk, 0, sizeof(*rk));
	__builtin_memcpy(&rk->saddr, &pkt->dst, sizeof(rk->saddr));
	__builtin_memcpy(&rk->daddr, &pkt->src, sizeof(rk->daddr));
	rk->sport = pkt->dport;
	rk->dport = pkt->sport;
	rk->proto = pkt->proto;
	rk->kind = NAT_CT_REV;
	struct nat_ct6_value *rv = nat_ct6.lookup(rk);
	if (rv && (rv->flags & (NAT_CT_F_NODEPORT | NAT_CT_F_SNAT)) == NAT_CT_F_NODEPORT)
		pkt->flags |= PKT_F_SVC_NAT;
}

/* nat_rev_from_wep (nat.h) for IPv6: calico_from_wep, a reply (CT_HIT_SVC_NAT) of a flow
 * that reached this pod through an IPv6 NodePort: source back to (node address, node
 * port), sent to the client with nat6_fib_redirect. Other packets: NAT_CONTINUE. */
PF_INLINE int nat6_rev_from_wep(struct __sk_buff *skb, struct pkt_info *pkt, __u64 now)
{
	if (!(pkt->flags & PKT_F_PORTS))
		return NAT_CONTINUE;
	__u32 zero = 0;
	struct nat6_scratch *sc = nat6_scratch.lookup(&zero);
	if (!sc)
		return TC_ACT_SHOT;
	struct nat_ct6_key *rk = &sc->rk;
	nat6_pkt_key(rk, pkt, NAT_CT_REV);
	struct nat_ct6_value *rv = nat_ct6.lookup(rk);
	if (!rv || (rv->flags & (NAT_CT_F_NODEPORT | NAT_CT_F_SNAT)) != NAT_CT_F_NODEPORT)
		return NAT_CONTINUE;
	rv->last_seen_ns = now;
	__builtin_memcpy(&sc->to_addr, &rv->addr, sizeof(sc->to_addr));
	if (nat6_rewrite(skb, pkt, 0, sc, rv->port)) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	count_nat(NAT_CNT_REPLIES);
	return nat6_fib_redirect(skb, pkt, sc);
}

#endif /* PYFELIX_NAT6_H */
