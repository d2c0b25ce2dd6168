/* nat.h: Kubernetes Services in the tc programs (the kube-proxy replacement's ClusterIP path).
 *
 * Maps: nat_frontend.h (VIP, port, proto -> service id, backend count, flags),
 * nat_backend.h (service id, index -> backend), nat_affinity.h (ClientIP affinity),
 * nat_ct.h (each flow's translation, both directions), nat_counters.h.
 *
 * calico_from_wep calls nat_from_wep() right after the source check and BEFORE conntrack
 * and policy, so the pod's egress policy sees the chosen backend, and the backend's
 * ingress policy (at its own to_wep, local or on another node) sees the client's address:
 *   - not TCP/UDP with ports, daddr's bit clear in nat_vip_filter (an array lookup: most
 *     traffic is not to a service), or no frontend for (daddr, dport, proto): nothing;
 *   - a nat_ct FWD entry for the tuple (a later packet of the flow): its backend, unless
 *     the packet is a TCP SYN (no ACK) on an entry older than CT_TIMEOUT_TCP_SYN (a new
 *     connection reusing the port gets a fresh choice) or the entry is idle longer than
 *     the protocol's conntrack timeout;
 *   - else a new flow: count == 0 -> REJECT (below); with ClientIP affinity, the client's
 *     nat_affinity backend while used within the timeout; else a random index in
 *     [0, count). FWD and REV entries are written, then the packet's destination address
 *     and port are rewritten (IP and L4 checksums updated incrementally).
 * calico_to_wep calls nat_rev_to_wep() for packets conntrack allowed as part of a service
 * flow (CT_F_SVC_NAT, set when the client's first packet was DNATed, so other flows pay
 * no lookup): the NAT_CT_REV entry for the tuple (a backend's reply) puts the VIP and
 * service port back as the source.
 *
 * REJECT (a Service without ready endpoints, kube-proxy's REJECT): the packet is turned
 * into an ICMP port unreachable from the VIP to the client (IPv4 header, ICMP header, the
 * original IP header and 8 bytes of L4, MACs swapped) and redirected out of the same
 * interface, back to the pod, whose TCP/UDP socket reports "connection refused" at once.
 * A conntrack entry for the original tuple is created first, so calico_to_wep passes the
 * error as related. A packet that cannot be turned (IP options, too short) is dropped
 * (NAT_CNT_REJECT_FAILED).
 *
 * Fail closed: a failed rewrite drops; a frontend whose chosen index is missing (between
 * two writes of an update) drops the packet, which the client retransmits.
 * HAIRPIN (a pod reaching itself through its Service): the pod cannot accept a packet from
 * its own address, so the forward direction is also source-NATed to the VIP (client port
 * kept): VIP:cport -> pod:bport, and sent straight back out of the interface
 * (nat_hairpin_verdict); the pod replies pod:bport -> VIP:cport, which the REV entry keyed
 * by the VIP recognises (nat_hairpin_reply), conntrack passes as a reply, and the program
 * sends back too; calico_to_wep then rewrites it to VIP:vport -> pod:cport. Both passes
 * through the interface are policed: egress as the pod sending to itself (the backend
 * port), ingress with the VIP as the source (kube-proxy shows the node's address instead).
 * The second pass's conntrack entries use ifindex | CT_IF_HAIRPIN (nat_ct_ifindex).
 *
 * ICMP errors about a service flow (a backend's port unreachable, say) are passed to the
 * client as related by conntrack and translated back by nat_rev_icmp_to_wep.
 *
 * NODEPORTS (nat_from_host; calico_from_host on data interfaces, calico_from_hep on host
 * endpoint interfaces, after its RPF check): a packet arriving on a host interface, TCP/UDP,
 * to one of this node's addresses (the routes map's RT_F_LOCAL_HOST), whose (port, proto)
 * has a NodePort frontend (key address NAT_NODEPORT_ADDR: "any address of this node"):
 *   - a later packet of the flow: the nat_ct FWD entry (flag NAT_CT_F_NODEPORT), as above;
 *   - a new flow: count == 0 -> REJECT back out of the interface (a Service without ready
 *     endpoints, or externalTrafficPolicy: Local on a node with no local endpoint: the calc
 *     graph then gives the frontend no backends); else affinity / a random backend.
 *   - backend on THIS node (RT_F_LOCAL_WORKLOAD): DNAT only, the CLIENT'S ADDRESS KEPT; the
 *     packet goes on through the host's stack (netfilter, routing) to the pod's interface,
 *     where calico_to_wep applies the backend's ingress policy to the real client. The
 *     REV entry (backend, client, ...) is flagged NAT_CT_F_NODEPORT; calico_to_wep marks the
 *     flow's conntrack entry CT_F_SVC_NAT when it finds one (nat_mark_nodeport, first
 *     packet only), so the backend's replies hit CT_HIT_SVC_NAT at calico_from_wep, whose
 *     nat_rev_from_wep puts (node address, node port) back as the source;
 *   - backend on ANOTHER node: DNAT and SNAT TO THE NODE (the address the client used,
 *     port: the client's own when free, else one of NAT_SNAT_TRIES random ports in
 *     [NAT_SNAT_PORT_MIN, 65535], above Linux's default ephemeral range; none free: drop,
 *     NAT_CNT_SNAT_NO_PORT), as kube-proxy's MASQUERADE does, so the backend's replies come
 *     back through this node: REV (backend, node address, backend port, SNAT port) ->
 *     (node address, node port, client). The backend's ingress policy (on its own node)
 *     sees this node's address, as with kube-proxy. externalTrafficPolicy: Local keeps the
 *     client's address because it never forwards.
 *   Packets whose source is (after SNAT) or whose destination was one of this node's own
 *   addresses cannot go through the host's input routing (a local source is a martian):
 *   the SNATed forward packets, the replies returned to the client at the host interface
 *   (nat_snat_reply) and at calico_from_wep (nat_rev_from_wep) are sent with a FIB lookup
 *   and bpf_redirect_neigh (nat_fib_redirect; no route: drop, NAT_CNT_NO_ROUTE). Those
 *   skip the node's netfilter; the TTL is not decremented.
 * Everything else arriving on a host interface (not TCP/UDP, not to a local address, no
 * NodePort frontend, no SNAT reply) takes exactly the path it took before: the program
 * returns TC_ACT_OK (calico_from_hep: after its RPF check). Its cost: a routes lookup, and
 * for local destinations a frontend and a nat_ct lookup.
 *
 * Not done here (yet): a pod or the host itself reaching a NodePort (only traffic arriving
 * on host interfaces is translated), ICMP errors about NodePort flows, SCTP port changes
 * (its CRC32c covers the ports).
 */
#ifndef PYFELIX_NAT_H
#define PYFELIX_NAT_H

#include "common.h"
#include "conntrack.h"
#include "nat_frontend.h"
#include "nat_backend.h"
#include "nat_affinity.h"
#include "nat_ct.h"
#include "nat_counters.h"
#include "nat_vip_filter.h"
#include "routes.h"

#define NAT_CONTINUE -1 /* nat_from_wep: go on with conntrack and policy */
/* skb->mark of a hairpin packet sent back to its pod: the WHOLE mark is set to this value
 * and compared whole (no single bit: iptables' policy chains use Felix's mark bits on
 * forwarded packets), and calico_to_wep clears it. A packet arriving from a pod carries no
 * mark (crossing the veth from another namespace scrubs it). */
#define PF_MARK_HAIRPIN 0x5a1e0c11
/* conntrack ifindex bit of a hairpin packet's second pass (conntrack.h keys) */
#define CT_IF_HAIRPIN 0x80000000

#define PF_ETH_HLEN 14
#define PF_IP_CSUM_OFF (PF_ETH_HLEN + 10)
#define PF_IP_SRC_OFF (PF_ETH_HLEN + 12)
#define PF_IP_DST_OFF (PF_ETH_HLEN + 16)
#define pf_htons(x) __builtin_bswap16(x)

PF_INLINE __u16 nat_csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* Rewrite the destination (is_dst) or source address and port of the packet, keeping the
 * IP and TCP/UDP checksums right; pkt follows. Returns 0, or -1 (caller drops). */
PF_INLINE int nat_rewrite(struct __sk_buff *skb, struct pkt_info *pkt, int is_dst,
			  __be32 new_addr, __u16 new_port)
{
	__u8 vihl = 0;
	if (bpf_skb_load_bytes(skb, PF_ETH_HLEN, &vihl, 1))
		return -1;
	__u32 l4_off = PF_ETH_HLEN + (vihl & 0x0f) * 4;
	__be32 old_addr = is_dst ? pkt->daddr : pkt->saddr;
	__u16 old_port = is_dst ? pkt->dport : pkt->sport;
	__u32 csum_off = 0;
	__u64 mangled = 0;
	if (pkt->proto == PF_IPPROTO_TCP) {
		csum_off = l4_off + 16;
	} else if (pkt->proto == PF_IPPROTO_UDP) {
		csum_off = l4_off + 6;
		mangled = BPF_F_MARK_MANGLED_0; /* a zero UDP checksum stays "none" */
	} else if (old_port != new_port) {
		return -1;
	}
	if (old_addr != new_addr) {
		if (csum_off && bpf_l4_csum_replace(skb, csum_off, old_addr, new_addr,
						    BPF_F_PSEUDO_HDR | mangled | 4))
			return -1;
		if (bpf_l3_csum_replace(skb, PF_IP_CSUM_OFF, old_addr, new_addr, 4))
			return -1;
		if (bpf_skb_store_bytes(skb, is_dst ? PF_IP_DST_OFF : PF_IP_SRC_OFF, &new_addr, 4,
					0))
			return -1;
	}
	if (old_port != new_port) {
		__be16 from = pf_htons(old_port), to = pf_htons(new_port);
		if (bpf_l4_csum_replace(skb, csum_off, from, to, mangled | 2))
			return -1;
		if (bpf_skb_store_bytes(skb, l4_off + (is_dst ? 2 : 0), &to, 2, 0))
			return -1;
	}
	if (is_dst) {
		pkt->daddr = new_addr;
		pkt->dst.w[0] = new_addr; /* the family-neutral copy (common.h) */
		pkt->dport = new_port;
	} else {
		pkt->saddr = new_addr;
		pkt->src.w[0] = new_addr;
		pkt->sport = new_port;
	}
	return 0;
}

struct nat_icmp_reply {
	struct iphdr ip;
	struct pf_icmp_hdr icmp;
	__u8 orig[28]; /* the original IPv4 header (no options) and 8 bytes of L4 */
};

/* Turn the packet into an ICMP port unreachable from its destination back to its source
 * and send it out of ifindex (towards the pod). Returns the tc verdict. */
PF_INLINE int nat_reject(struct __sk_buff *skb, struct pkt_info *pkt, __u32 ifindex, __u64 now)
{
	struct ethhdr eth = {};
	struct nat_icmp_reply r = {};
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) ||
	    bpf_skb_load_bytes(skb, PF_ETH_HLEN, r.orig, sizeof(r.orig)) ||
	    (r.orig[0] & 0x0f) != 5) {
		count_nat(NAT_CNT_REJECT_FAILED);
		return TC_ACT_SHOT;
	}
	r.ip.version = 4;
	r.ip.ihl = 5;
	r.ip.tos = 0xc0;
	r.ip.tot_len = pf_htons((__u16)sizeof(r));
	r.ip.ttl = 64;
	r.ip.protocol = PF_IPPROTO_ICMP;
	r.ip.saddr = pkt->daddr;
	r.ip.daddr = pkt->saddr;
	r.icmp.type = 3; /* destination unreachable */
	r.icmp.code = 3; /* port unreachable: what kube-proxy's REJECT sends */
	r.icmp.checksum = nat_csum_fold(bpf_csum_diff(0, 0, (__be32 *)&r.icmp,
						      sizeof(r.icmp) + sizeof(r.orig), 0));
	r.ip.check = nat_csum_fold(bpf_csum_diff(0, 0, (__be32 *)&r.ip, sizeof(r.ip), 0));
	struct ethhdr out = {};
	__builtin_memcpy(out.h_dest, eth.h_source, ETH_ALEN);
	__builtin_memcpy(out.h_source, eth.h_dest, ETH_ALEN);
	out.h_proto = eth.h_proto;
	if (bpf_skb_change_tail(skb, PF_ETH_HLEN + sizeof(r), 0) ||
	    bpf_skb_store_bytes(skb, 0, &out, sizeof(out), 0) ||
	    bpf_skb_store_bytes(skb, PF_ETH_HLEN, &r, sizeof(r), 0)) {
		count_nat(NAT_CNT_REJECT_FAILED);
		return TC_ACT_SHOT;
	}
	/* the error is "related" to this tuple at the pod's to_wep */
	ct_create(pkt, ifindex, HOOK_FROM_WEP, now, 0);
	count_nat(NAT_CNT_REJECTED);
	return bpf_redirect(ifindex, 0);
}

/* Idle timeout of a NAT flow: the conntrack timeout of its protocol once established. */
PF_INLINE __u64 nat_idle_ns(__u8 proto)
{
	if (proto == PF_IPPROTO_TCP)
		return CT_TIMEOUT_TCP_EST * CT_NS_PER_S;
	if (proto == PF_IPPROTO_UDP)
		return CT_TIMEOUT_UDP * CT_NS_PER_S;
	return CT_TIMEOUT_OTHER * CT_NS_PER_S;
}

PF_INLINE int nat_ct_usable(struct nat_ct_value *v, struct pkt_info *pkt, __u64 now)
{
	if (now > v->last_seen_ns && now - v->last_seen_ns > nat_idle_ns(pkt->proto))
		return 0;
	if (pkt->proto == PF_IPPROTO_TCP &&
	    (pkt->tcp_flags & (PF_TCP_SYN | PF_TCP_ACK)) == PF_TCP_SYN &&
	    now > v->created_ns && now - v->created_ns > CT_TIMEOUT_TCP_SYN * CT_NS_PER_S)
		return 0; /* a new connection reusing the tuple: choose again */
	return 1;
}

/* A pod's packet to a VIP that no frontend port matches: the reply of a hairpin flow (the
 * pod is its own backend, replying from the backend port to VIP:client port)? Only marked
 * here: conntrack then checks it under the hairpin key, the program sends it back to the
 * pod, and calico_to_wep reverses its NAT (nat_rev_to_wep). */
PF_INLINE int nat_hairpin_reply(struct pkt_info *pkt)
{
	struct nat_ct_key rk = {};
	rk.saddr = pkt->saddr;
	rk.daddr = pkt->daddr;
	rk.sport = pkt->sport;
	rk.dport = pkt->dport;
	rk.proto = pkt->proto;
	rk.kind = NAT_CT_REV;
	struct nat_ct_value *v = nat_ct.lookup(&rk);
	if (v && (v->flags & NAT_CT_F_HAIRPIN))
		pkt->flags |= PKT_F_HAIRPIN_REPLY;
	return NAT_CONTINUE;
}

/* A new flow's backend: the client's affinity backend while fresh, else a random index of
 * [0, fe->count) (count > 0), recorded as the client's affinity. Returns 0, or -1 when the
 * chosen index is missing (between two writes of an update: the caller drops). */
PF_INLINE int nat_choose_backend(struct nat_fe_value *fe, struct pkt_info *pkt, __u64 now,
				 __be32 *be_addr, __u16 *be_port)
{
	struct nat_aff_key ak = {};
	ak.service_id = fe->service_id;
	ak.client = pkt->saddr;
	if (fe->flags & NAT_FE_F_AFFINITY) {
		struct nat_aff_value *av = nat_affinity.lookup(&ak);
		__u64 timeout = (__u64)fe->affinity_timeout * CT_NS_PER_S;
		if (av && !(now > av->last_used_ns && now - av->last_used_ns > timeout)) {
			*be_addr = av->addr;
			*be_port = av->port;
			av->last_used_ns = now;
			count_nat(NAT_CNT_AFFINITY_HIT);
			return 0;
		}
	}
	struct nat_be_value *be = nat_fe_backend(fe, bpf_get_prandom_u32() % fe->count);
	if (!be) {
		count_nat(NAT_CNT_NO_BACKEND);
		return -1;
	}
	*be_addr = be->addr;
	*be_port = be->port;
	if (fe->flags & NAT_FE_F_AFFINITY) {
		struct nat_aff_value nav = {};
		nav.addr = be->addr;
		nav.port = be->port;
		nav.last_used_ns = now;
		nat_affinity.update(&ak, &nav);
	}
	return 0;
}

/* The service NAT of a packet from a pod (see the top of this file). Returns NAT_CONTINUE
 * (translated or not a service flow: conntrack and policy follow) or a tc verdict. */
PF_INLINE int nat_from_wep(struct __sk_buff *skb, struct pkt_info *pkt, __u32 ifindex,
			   __u64 now)
{
	if (!(pkt->flags & PKT_F_PORTS) || !nat_maybe_vip(pkt->daddr))
		return NAT_CONTINUE;
	struct nat_fe_key fk = {};
	fk.addr = pkt->daddr;
	fk.port = pkt->dport;
	fk.proto = pkt->proto;
	struct nat_fe_value *fe = nat_frontend.lookup(&fk);
	if (!fe)
		return nat_hairpin_reply(pkt);

	struct nat_ct_key ck = {};
	ck.saddr = pkt->saddr;
	ck.daddr = pkt->daddr;
	ck.sport = pkt->sport;
	ck.dport = pkt->dport;
	ck.proto = pkt->proto;
	ck.kind = NAT_CT_FWD;
	__be32 be_addr = 0;
	__u16 be_port = 0;
	__u16 hairpin = 0;
	struct nat_ct_value *cv = nat_ct.lookup(&ck);
	if (cv && nat_ct_usable(cv, pkt, now)) {
		be_addr = cv->addr;
		be_port = cv->port;
		hairpin = cv->flags & NAT_CT_F_HAIRPIN;
		cv->last_seen_ns = now;
		count_nat(NAT_CNT_CT_HIT);
	} else {
		if (fe->count == 0)
			return nat_reject(skb, pkt, ifindex, now);
		if (nat_choose_backend(fe, pkt, now, &be_addr, &be_port))
			return TC_ACT_SHOT;
		hairpin = be_addr == pkt->saddr ? NAT_CT_F_HAIRPIN : 0;
		struct nat_ct_value fwd = {};
		fwd.addr = be_addr;
		fwd.port = be_port;
		fwd.flags = hairpin;
		fwd.created_ns = now;
		fwd.last_seen_ns = now;
		nat_ct.update(&ck, &fwd);
		/* the reply's key: (backend, client) normally; for hairpin the pod replies to the
		 * VIP it sees as the source (backend, VIP, backend port, client port) */
		struct nat_ct_key rk = {};
		rk.saddr = be_addr;
		rk.daddr = hairpin ? pkt->daddr : pkt->saddr;
		rk.sport = be_port;
		rk.dport = pkt->sport;
		rk.proto = pkt->proto;
		rk.kind = NAT_CT_REV;
		struct nat_ct_value rev = {};
		rev.addr = pkt->daddr;
		rev.port = pkt->dport;
		rev.flags = hairpin;
		rev.created_ns = now;
		rev.last_seen_ns = now;
		nat_ct.update(&rk, &rev);
		count_nat(NAT_CNT_NEW_FLOWS);
	}
	__be32 vip = pkt->daddr;
	if (nat_rewrite(skb, pkt, 1, be_addr, be_port) ||
	    (hairpin && nat_rewrite(skb, pkt, 0, vip, pkt->sport))) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	/* conntrack marks the flow: its replies are looked up */
	pkt->flags |= PKT_F_SVC_NAT | (hairpin ? PKT_F_HAIRPIN : 0);
	return NAT_CONTINUE;
}

/* The tc verdict for a hairpin packet that conntrack or policy allowed at calico_from_wep:
 * back out of the same interface to the pod (routing would send a packet to the VIP, or
 * from it, nowhere useful). The forward direction carries PF_MARK_HAIRPIN, so the pod's
 * calico_to_wep keeps its conntrack entry apart (CT_IF_HAIRPIN) from this hook's entry of
 * the same tuple. The MACs are swapped (the pod's becomes the destination). Other packets:
 * `verdict` unchanged. */
PF_INLINE int nat_hairpin_verdict(struct __sk_buff *skb, struct pkt_info *pkt, int verdict)
{
	if (verdict != TC_ACT_OK || !(pkt->flags & (PKT_F_HAIRPIN | PKT_F_HAIRPIN_REPLY)))
		return verdict;
	/* back to the pod: its MAC becomes the destination again */
	__u8 macs[12];
	__u8 swapped[12];
	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs))) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	__builtin_memcpy(swapped, macs + 6, 6);
	__builtin_memcpy(swapped + 6, macs, 6);
	if (bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0)) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	if (pkt->flags & PKT_F_HAIRPIN)
		skb->mark = PF_MARK_HAIRPIN;
	return bpf_redirect(skb->ifindex, 0);
}

/* The conntrack ifindex of a packet: a hairpin packet's second pass through the pod's
 * interface (marked forward packets at calico_to_wep; replies at calico_from_wep) is
 * tracked apart, so the two hooks' entries of one tuple do not overwrite each other. */
PF_INLINE __u32 nat_ct_ifindex(struct __sk_buff *skb, struct pkt_info *pkt, __u32 ifindex,
			       __u8 hook)
{
	if (hook == HOOK_TO_WEP && skb->mark == PF_MARK_HAIRPIN) {
		skb->mark = 0;
		return ifindex | CT_IF_HAIRPIN;
	}
	if (pkt->flags & PKT_F_HAIRPIN_REPLY)
		return ifindex | CT_IF_HAIRPIN;
	return ifindex;
}

/* A reply to a service flow on its way to the client pod: source back to the VIP.
 * Returns the tc verdict (TC_ACT_OK, or TC_ACT_SHOT when the rewrite failed). */
PF_INLINE int nat_rev_to_wep(struct __sk_buff *skb, struct pkt_info *pkt, __u64 now)
{
	if (!(pkt->flags & PKT_F_PORTS))
		return TC_ACT_OK;
	struct nat_ct_key rk = {};
	rk.saddr = pkt->saddr;
	rk.daddr = pkt->daddr;
	rk.sport = pkt->sport;
	rk.dport = pkt->dport;
	rk.proto = pkt->proto;
	rk.kind = NAT_CT_REV;
	struct nat_ct_value *rv = nat_ct.lookup(&rk);
	if (!rv)
		return TC_ACT_OK;
	rv->last_seen_ns = now;
	__be32 backend = pkt->saddr;
	if (nat_rewrite(skb, pkt, 0, rv->addr, rv->port) ||
	    ((rv->flags & NAT_CT_F_HAIRPIN) && nat_rewrite(skb, pkt, 1, backend, pkt->dport))) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	count_nat(NAT_CNT_REPLIES);
	return TC_ACT_OK;
}

/* An ICMP error about a service flow, on its way to the client pod (conntrack found it
 * related): the backend (or a router on the way) quoted the translated packet, client ->
 * backend:port; the client's socket knows the VIP. Puts the VIP back as the error's source
 * and as the quoted destination (address and port), keeping the quoted IP header's checksum
 * and the ICMP checksum right (the quoted L4 checksum is not checked by receivers).
 * Returns the tc verdict (TC_ACT_SHOT when a rewrite failed). */
PF_INLINE int nat_rev_icmp_to_wep(struct __sk_buff *skb, struct pkt_info *pkt)
{
	if (pkt->inner_proto != PF_IPPROTO_TCP && pkt->inner_proto != PF_IPPROTO_UDP)
		return TC_ACT_OK;
	struct nat_ct_key rk = {};
	rk.saddr = pkt->inner_daddr;
	rk.daddr = pkt->inner_saddr;
	rk.sport = pkt->inner_dport;
	rk.dport = pkt->inner_sport;
	rk.proto = pkt->inner_proto;
	rk.kind = NAT_CT_REV;
	struct nat_ct_value *rv = nat_ct.lookup(&rk);
	if (!rv || (rv->flags & NAT_CT_F_HAIRPIN))
		return TC_ACT_OK;
	__be32 vip = rv->addr;
	__be16 vport = pf_htons(rv->port);
	__be16 old_port = pf_htons(pkt->inner_dport);
	__be32 backend = pkt->inner_daddr;
	__u8 vihl = 0, inner_vihl = 0;
	if (bpf_skb_load_bytes(skb, PF_ETH_HLEN, &vihl, 1))
		goto fail;
	__u32 icmp_off = PF_ETH_HLEN + (vihl & 0x0f) * 4;
	__u32 inner_off = icmp_off + 8;
	if (bpf_skb_load_bytes(skb, inner_off, &inner_vihl, 1))
		goto fail;
	__u32 inner_l4 = inner_off + (inner_vihl & 0x0f) * 4;
	__u32 icmp_csum = icmp_off + 2;
	__u16 old_inner_csum = 0, new_inner_csum = 0;
	if (bpf_skb_load_bytes(skb, inner_off + 10, &old_inner_csum, 2) ||
	    bpf_l3_csum_replace(skb, inner_off + 10, backend, vip, 4) ||
	    bpf_skb_load_bytes(skb, inner_off + 10, &new_inner_csum, 2) ||
	    bpf_l4_csum_replace(skb, icmp_csum, old_inner_csum, new_inner_csum, 2) ||
	    bpf_l4_csum_replace(skb, icmp_csum, backend, vip, 4) ||
	    bpf_skb_store_bytes(skb, inner_off + 16, &vip, 4, 0) ||
	    bpf_l4_csum_replace(skb, icmp_csum, old_port, vport, 2) ||
	    bpf_skb_store_bytes(skb, inner_l4 + 2, &vport, 2, 0))
		goto fail;
	if (pkt->saddr == backend &&
	    (bpf_l3_csum_replace(skb, PF_IP_CSUM_OFF, backend, vip, 4) ||
	     bpf_skb_store_bytes(skb, PF_IP_SRC_OFF, &vip, 4, 0)))
		goto fail;
	count_nat(NAT_CNT_REPLIES);
	return TC_ACT_OK;
fail:
	count_nat(NAT_CNT_XLATE_FAILED);
	return TC_ACT_SHOT;
}

/* ---- NodePorts (see the top of this file) ---- */

#define NAT_NODEPORT_ADDR 0     /* a NodePort frontend's key address: any of this node's */
#define NAT_SNAT_PORT_MIN 61000 /* SNAT ports beyond the client's own: [MIN, 65535] */
#define NAT_SNAT_PORT_SPAN (65536 - NAT_SNAT_PORT_MIN)
#define NAT_SNAT_TRIES 4 /* the client's port, then random ones */

/* BCC 0.26 declares bpf_redirect_neigh without its `plen` argument, which would leave the
 * kernel's `flags` register unset: declared here as the kernel defines it. */
static long (*pf_redirect_neigh)(__u32 ifindex, void *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;

/* The routes map's flags for an IPv4 address (0: no route). */
PF_INLINE __u32 nat_route_flags(__be32 addr)
{
	struct route_key key = {};
	key.prefixlen = ROUTE_KEY_FIXED_BITS + 32;
	key.family = 4;
	key.addr.w[0] = addr;
	struct route_value *v = routes.lookup(&key);
	return v ? v->flags : 0;
}

/* Send the (translated) packet towards its destination without the host's input routing:
 * the interface from a FIB lookup, the next hop's MAC by bpf_redirect_neigh. */
PF_INLINE int nat_fib_redirect(struct __sk_buff *skb, struct pkt_info *pkt)
{
	struct bpf_fib_lookup fib = {};
	fib.family = 2; /* AF_INET */
	fib.l4_protocol = pkt->proto;
	fib.tot_len = 0;
	fib.ipv4_src = pkt->saddr;
	fib.ipv4_dst = pkt->daddr;
	fib.ifindex = skb->ifindex;
	int rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		count_nat(NAT_CNT_NO_ROUTE);
		return TC_ACT_SHOT;
	}
	return pf_redirect_neigh(fib.ifindex, NULL, 0, 0);
}

/* A reply from a backend on another node to a flow source-NATed to this node (the packet
 * is addressed to this node's address and SNAT port)? Back to (node address, node port) ->
 * client, sent on with nat_fib_redirect. Otherwise NAT_CONTINUE. */
PF_INLINE int nat_snat_reply(struct __sk_buff *skb, struct pkt_info *pkt, __u64 now)
{
	struct nat_ct_key rk = {};
	rk.saddr = pkt->saddr;
	rk.daddr = pkt->daddr;
	rk.sport = pkt->sport;
	rk.dport = pkt->dport;
	rk.proto = pkt->proto;
	rk.kind = NAT_CT_REV;
	struct nat_ct_value *rv = nat_ct.lookup(&rk);
	if (!rv || !(rv->flags & NAT_CT_F_SNAT))
		return NAT_CONTINUE;
	rv->last_seen_ns = now;
	if (nat_rewrite(skb, pkt, 0, rv->addr, rv->port) ||
	    nat_rewrite(skb, pkt, 1, rv->peer_addr, rv->peer_port)) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	count_nat(NAT_CNT_REPLIES);
	return nat_fib_redirect(skb, pkt);
}

/* An SNAT port for a new NodePort flow to a remote backend: the client's own port unless
 * another live flow holds (backend, node address, backend port, port) or it is a NodePort's
 * number, else random ones.
 * Returns the port, or 0 when every try is taken. */
PF_INLINE __u16 nat_snat_port(struct pkt_info *pkt, __be32 be_addr, __u16 be_port, __u64 now)
{
	struct nat_ct_key rk = {};
	rk.saddr = be_addr;
	rk.daddr = pkt->daddr;
	rk.sport = be_port;
	rk.proto = pkt->proto;
	rk.kind = NAT_CT_REV;
	for (int i = 0; i < NAT_SNAT_TRIES; i++) {
		__u16 port = i == 0 ? pkt->sport
				    : NAT_SNAT_PORT_MIN + bpf_get_prandom_u32() % NAT_SNAT_PORT_SPAN;
		rk.dport = port;
		/* never a NodePort's number: the reply would look like a new NodePort flow */
		struct nat_fe_key fk = {};
		fk.addr = NAT_NODEPORT_ADDR;
		fk.port = port;
		fk.proto = pkt->proto;
		if (nat_frontend.lookup(&fk))
			continue;
		struct nat_ct_value *taken = nat_ct.lookup(&rk);
		if (!taken || (taken->peer_addr == pkt->saddr && taken->peer_port == pkt->sport) ||
		    (now > taken->last_seen_ns &&
		     now - taken->last_seen_ns > nat_idle_ns(pkt->proto)))
			return port;
	}
	return 0;
}

/* The NodePort NAT of a packet arriving on a host interface (see the top of this file).
 * Returns NAT_CONTINUE (not NodePort traffic: the interface's usual path) or a tc verdict. */
PF_INLINE int nat_from_host(struct __sk_buff *skb, struct pkt_info *pkt, __u64 now)
{
	if (!(pkt->flags & PKT_F_PORTS) || !(nat_route_flags(pkt->daddr) & RT_F_LOCAL_HOST))
		return NAT_CONTINUE;
	struct nat_fe_key fk = {};
	fk.addr = NAT_NODEPORT_ADDR;
	fk.port = pkt->dport;
	fk.proto = pkt->proto;
	struct nat_fe_value *fe = nat_frontend.lookup(&fk);
	if (!fe)
		return nat_snat_reply(skb, pkt, now);

	struct nat_ct_key ck = {};
	ck.saddr = pkt->saddr;
	ck.daddr = pkt->daddr;
	ck.sport = pkt->sport;
	ck.dport = pkt->dport;
	ck.proto = pkt->proto;
	ck.kind = NAT_CT_FWD;
	__be32 be_addr = 0;
	__u16 be_port = 0;
	__u16 snat_port = 0;
	struct nat_ct_value *cv = nat_ct.lookup(&ck);
	if (cv && (cv->flags & NAT_CT_F_NODEPORT) && nat_ct_usable(cv, pkt, now)) {
		be_addr = cv->addr;
		be_port = cv->port;
		snat_port = (cv->flags & NAT_CT_F_SNAT) ? cv->peer_port : 0;
		cv->last_seen_ns = now;
		count_nat(NAT_CNT_CT_HIT);
	} else {
		if (fe->count == 0)
			return nat_reject(skb, pkt, skb->ifindex, now);
		if (nat_choose_backend(fe, pkt, now, &be_addr, &be_port))
			return TC_ACT_SHOT;
		__u16 flags = NAT_CT_F_NODEPORT;
		if (!(nat_route_flags(be_addr) & RT_F_LOCAL_WORKLOAD)) {
			snat_port = nat_snat_port(pkt, be_addr, be_port, now);
			if (!snat_port) {
				count_nat(NAT_CNT_SNAT_NO_PORT);
				return TC_ACT_SHOT;
			}
			flags |= NAT_CT_F_SNAT;
			count_nat(NAT_CNT_NODEPORT_SNAT);
		}
		struct nat_ct_value fwd = {};
		fwd.addr = be_addr;
		fwd.port = be_port;
		fwd.flags = flags;
		fwd.created_ns = now;
		fwd.last_seen_ns = now;
		if (snat_port) {
			fwd.peer_addr = pkt->daddr;
			fwd.peer_port = snat_port;
		}
		nat_ct.update(&ck, &fwd);
		struct nat_ct_key rk = {};
		rk.saddr = be_addr;
		rk.daddr = snat_port ? pkt->daddr : pkt->saddr;
		rk.sport = be_port;
		rk.dport = snat_port ? snat_port : pkt->sport;
		rk.proto = pkt->proto;
		rk.kind = NAT_CT_REV;
		struct nat_ct_value rev = {};
		rev.addr = pkt->daddr;
		rev.port = pkt->dport;
		rev.flags = flags;
		rev.created_ns = now;
		rev.last_seen_ns = now;
		rev.peer_addr = pkt->saddr;
		rev.peer_port = pkt->sport;
		nat_ct.update(&rk, &rev);
		count_nat(NAT_CNT_NEW_FLOWS);
		count_nat(NAT_CNT_NODEPORT_NEW);
	}
	__be32 node_addr = pkt->daddr;
	if (nat_rewrite(skb, pkt, 1, be_addr, be_port) ||
	    (snat_port && nat_rewrite(skb, pkt, 0, node_addr, snat_port))) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	if (!snat_port)
		return TC_ACT_OK; /* to the local backend through the stack: its to_wep polices it */
	return nat_fib_redirect(skb, pkt);
}

/* calico_to_wep, first packet of a flow (conntrack missed): a NodePort flow DNATed at a
 * host interface to this local backend? Then its conntrack entry is marked CT_F_SVC_NAT,
 * so the backend's replies get nat_rev_from_wep. */
PF_INLINE void nat_mark_nodeport(struct pkt_info *pkt)
{
	if (!(pkt->flags & PKT_F_PORTS))
		return;
	struct nat_ct_key rk = {};
	rk.saddr = pkt->daddr;
	rk.daddr = pkt->saddr;
	rk.sport = pkt->dport;
	rk.dport = pkt->sport;
	rk.proto = pkt->proto;
	rk.kind = NAT_CT_REV;
	struct nat_ct_value *rv = nat_ct.lookup(&rk);
	if (rv && (rv->flags & (NAT_CT_F_NODEPORT | NAT_CT_F_SNAT)) == NAT_CT_F_NODEPORT)
		pkt->flags |= PKT_F_SVC_NAT;
}

/* calico_from_wep, a reply (conntrack: CT_HIT_SVC_NAT) of a flow that reached this pod
 * through a NodePort: source back to (node address, node port), sent to the client with
 * nat_fib_redirect. Other packets (a ClusterIP client's own): NAT_CONTINUE. */
PF_INLINE int nat_rev_from_wep(struct __sk_buff *skb, struct pkt_info *pkt, __u64 now)
{
	if (!(pkt->flags & PKT_F_PORTS))
		return NAT_CONTINUE;
	struct nat_ct_key rk = {};
	rk.saddr = pkt->saddr;
	rk.daddr = pkt->daddr;
	rk.sport = pkt->sport;
	rk.dport = pkt->dport;
	rk.proto = pkt->proto;
	rk.kind = NAT_CT_REV;
	struct nat_ct_value *rv = nat_ct.lookup(&rk);
	if (!rv || (rv->flags & (NAT_CT_F_NODEPORT | NAT_CT_F_SNAT)) != NAT_CT_F_NODEPORT)
		return NAT_CONTINUE;
	rv->last_seen_ns = now;
	if (nat_rewrite(skb, pkt, 0, rv->addr, rv->port)) {
		count_nat(NAT_CNT_XLATE_FAILED);
		return TC_ACT_SHOT;
	}
	count_nat(NAT_CNT_REPLIES);
	return nat_fib_redirect(skb, pkt);
}

#endif /* PYFELIX_NAT_H */
