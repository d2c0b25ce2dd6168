/* conntrack.h: per-interface connection tracking (LRU hash).
 *
 * Python twin: agent/bpf/maps/conntrack.py (struct ct_key / ct_value, CT_F_* flags and the
 * timeout rules must match) and the cleaner agent/bpf/conntrack.py.
 *
 * Key = (ifindex of the hook's interface, 5-tuple NORMALISED so that side A is the smaller
 * (address, port) pair): both directions of a flow find the same entry with one lookup.
 * The value records which side opened the flow (CT_F_ORIG_A_TO_B) and at which hook its
 * first packet was allowed (CT_F_ORIG_TO_WEP). A packet is "established" when it goes in
 * the original direction at the original hook, or in the reply direction at the other hook
 * of the same interface. Anything else (for example a reply-direction packet at the
 * original hook, which would be a spoofed source) is a miss and goes through policy.
 *
 * A pod-to-pod flow on one host gets two entries, one per interface: each side's policy was
 * evaluated at its own interface, and each side's replies are allowed at its own interface.
 *
 * Clock: ct_now_ns() = bpf_ktime_get_coarse_ns(), CLOCK_MONOTONIC_COARSE (one tick of
 * resolution, 1-4 ms), when the loader defines PF_KTIME_COARSE (kernel 5.11+); else
 * bpf_ktime_get_ns(), CLOCK_MONOTONIC. Timeouts are whole seconds, so the tick does not
 * matter, and the coarse read costs ~20 ns less per packet on the established path
 * (measured with BPF_PROG_TEST_RUN: 148 -> 127 ns per conntrack hit). The Python side reads
 * the coarse clock (agent/bpf/maps/conntrack.py now_ns()); the two clocks differ by less
 * than one tick, so mixing them (old kernel, or entries written by a build on the other
 * clock) only shifts an age by a few ms.
 *
 * Timeouts (since last_seen_ns): an expired entry is a
 * MISS for the programs (the packet goes through policy and, if allowed, the entry is
 * rewritten); the Python cleaner deletes expired entries. TCP: before a reply is seen
 * CT_TIMEOUT_TCP_SYN, established CT_TIMEOUT_TCP_EST, after FIN both ways CT_TIMEOUT_TCP_FIN,
 * after RST CT_TIMEOUT_TCP_RST; a SYN (without ACK) hitting a closed entry starts afresh.
 * UDP CT_TIMEOUT_UDP, ICMP CT_TIMEOUT_ICMP, anything else (SCTP...) CT_TIMEOUT_OTHER.
 * A TCP flow picked up mid-stream (first packet seen is not a SYN, e.g. after the map was
 * lost) is created as established once policy allows it.
 *
 * Both families share the map: the key's addresses are 16 bytes (IPv4 in the first 4, the
 * rest 0) and its family byte keeps an IPv4 and an IPv6 flow apart.
 *
 * ICMP / ICMPv6 echo: the echo id is both "ports"; requests only match in the original direction,
 * replies only in the reply direction (the peer pinging back with the same id is new).
 * ICMP errors (unreachable, time exceeded, ...) whose inner packet belongs to a tracked
 * flow of the same interface are allowed as "related" (GCNT_CT_RELATED).
 */
#ifndef PYFELIX_CONNTRACK_H
#define PYFELIX_CONNTRACK_H

#include "common.h"
#include "counters.h"

#ifndef CONNTRACK_MAX_ENTRIES
#define CONNTRACK_MAX_ENTRIES 262144
#endif

/* Timeouts in seconds; the loader passes the values of agent/bpf/maps/conntrack.py. */
#ifndef CT_TIMEOUT_TCP_SYN
#define CT_TIMEOUT_TCP_SYN 20
#endif
#ifndef CT_TIMEOUT_TCP_EST
#define CT_TIMEOUT_TCP_EST 3600
#endif
#ifndef CT_TIMEOUT_TCP_FIN
#define CT_TIMEOUT_TCP_FIN 30
#endif
#ifndef CT_TIMEOUT_TCP_RST
#define CT_TIMEOUT_TCP_RST 10
#endif
#ifndef CT_TIMEOUT_UDP
#define CT_TIMEOUT_UDP 60
#endif
#ifndef CT_TIMEOUT_ICMP
#define CT_TIMEOUT_ICMP 5
#endif
#ifndef CT_TIMEOUT_OTHER
#define CT_TIMEOUT_OTHER 60
#endif

#define CT_NS_PER_S 1000000000ULL

/* The conntrack clock (see the top of this file). */
#ifdef PF_KTIME_COARSE
#define ct_now_ns() bpf_ktime_get_coarse_ns()
#else
#define ct_now_ns() bpf_ktime_get_ns()
#endif

#define CT_F_ORIG_A_TO_B 0x01 /* the first packet went from side A to side B */
#define CT_F_ORIG_TO_WEP 0x02 /* the first packet was allowed at the to_wep hook */
#define CT_F_SEEN_REPLY 0x04  /* a reply-direction packet was seen (TCP: established) */
#define CT_F_FIN_ORIG 0x08
#define CT_F_FIN_REPLY 0x10
#define CT_F_RST 0x20
#define CT_F_SVC_NAT 0x40 /* first packet was DNATed to a service backend (nat.h) */

/* ct_lookup_update() results (non-zero: a hit) */
#define CT_HIT 1
#define CT_HIT_SVC_NAT 3 /* a reply of a service flow: it needs the reverse NAT */

struct ct_key {
	__u32 ifindex;
	struct pf_addr addr_a; /* (addr_a, port_a) <= (addr_b, port_b): see ct_fill_key */
	struct pf_addr addr_b;
	__u16 port_a;
	__u16 port_b;
	__u8 proto;
	__u8 family; /* 4 or 6: IPv4 uses w[0] of the addresses, the rest 0 */
	__u8 pad[2];
};

struct ct_value {
	__u64 created_ns;
	__u64 last_seen_ns;
	__u64 packets; /* both directions, at this interface */
	__u64 bytes;
	__u32 flags;      /* CT_F_* */
	__u32 counter_id; /* rule counter of the rule that allowed the first packet, 0 if none */
};

BPF_TABLE_PINNED("lru_hash", struct ct_key, struct ct_value, conntrack, CONNTRACK_MAX_ENTRIES,
		 PIN_DIR "/conntrack_v2");

/* (a, pa) <= (b, pb), addresses as unsigned big-endian numbers (IPv4: w[0], the rest 0) */
PF_INLINE int ct_side_le(const struct pf_addr *a, const struct pf_addr *b, __u16 pa, __u16 pb)
{
	__u64 ah = ((__u64)pf_ntohl(a->w[0]) << 32) | pf_ntohl(a->w[1]);
	__u64 bh = ((__u64)pf_ntohl(b->w[0]) << 32) | pf_ntohl(b->w[1]);
	if (ah != bh)
		return ah < bh;
	__u64 al = ((__u64)pf_ntohl(a->w[2]) << 32) | pf_ntohl(a->w[3]);
	__u64 bl = ((__u64)pf_ntohl(b->w[2]) << 32) | pf_ntohl(b->w[3]);
	if (al != bl)
		return al < bl;
	return pa <= pb;
}

/* Fill key from a tuple; returns 1 if the packet goes from side A to side B. */
PF_INLINE int ct_fill_key(struct ct_key *key, __u32 ifindex, const struct pf_addr *saddr,
			  const struct pf_addr *daddr, __u16 sport, __u16 dport, __u8 proto,
			  __u8 family)
{
	int src_is_a = ct_side_le(saddr, daddr, sport, dport);
	key->ifindex = ifindex;
	key->proto = proto;
	key->family = family;
	if (src_is_a) {
		__builtin_memcpy(&key->addr_a, saddr, 16);
		__builtin_memcpy(&key->addr_b, daddr, 16);
		key->port_a = sport;
		key->port_b = dport;
	} else {
		__builtin_memcpy(&key->addr_a, daddr, 16);
		__builtin_memcpy(&key->addr_b, saddr, 16);
		key->port_a = dport;
		key->port_b = sport;
	}
	return src_is_a;
}

/* The key of the packet's own tuple. */
PF_INLINE int ct_fill_pkt_key(struct ct_key *key, __u32 ifindex, struct pkt_info *pkt)
{
	return ct_fill_key(key, ifindex, &pkt->src, &pkt->dst, pkt->sport, pkt->dport,
			   pkt->proto, 4 + 2 * pkt_v6_bit(pkt));
}

PF_INLINE __u64 ct_timeout_ns(__u8 proto, __u32 flags)
{
	__u64 secs;
	if (proto == PF_IPPROTO_TCP) {
		if (flags & CT_F_RST)
			secs = CT_TIMEOUT_TCP_RST;
		else if ((flags & (CT_F_FIN_ORIG | CT_F_FIN_REPLY)) == (CT_F_FIN_ORIG | CT_F_FIN_REPLY))
			secs = CT_TIMEOUT_TCP_FIN;
		else if (flags & CT_F_SEEN_REPLY)
			secs = CT_TIMEOUT_TCP_EST;
		else
			secs = CT_TIMEOUT_TCP_SYN;
	} else if (proto == PF_IPPROTO_UDP) {
		secs = CT_TIMEOUT_UDP;
	} else if (proto == PF_IPPROTO_ICMP || proto == PF_IPPROTO_ICMPV6) {
		secs = CT_TIMEOUT_ICMP;
	} else {
		secs = CT_TIMEOUT_OTHER;
	}
	return secs * CT_NS_PER_S;
}

PF_INLINE int ct_expired(struct ct_value *v, __u8 proto, __u64 now)
{
	__u64 last = v->last_seen_ns;
	return now > last && now - last > ct_timeout_ns(proto, v->flags);
}

/* Established/reply packet of a tracked flow? Updates the entry on a hit. Returns 0 on a
 * miss, CT_HIT, or CT_HIT_SVC_NAT for a reply-direction packet of a service flow (nat.h); on
 * a hit, *reply says whether the packet went in the flow's reply direction. */
PF_INLINE int ct_lookup_update(struct pkt_info *pkt, __u32 ifindex, __u8 hook, __u64 now,
			     int *reply)
{
	struct ct_key key = {};
	int a_to_b = ct_fill_pkt_key(&key, ifindex, pkt);
	struct ct_value *v = conntrack.lookup(&key);
	if (!v)
		return 0;
	__u32 flags = v->flags;
	int orig_dir = (a_to_b != 0) == ((flags & CT_F_ORIG_A_TO_B) != 0);
	int orig_hook = (hook == HOOK_TO_WEP) == ((flags & CT_F_ORIG_TO_WEP) != 0);
	if (orig_dir != orig_hook)
		return 0;
	/* ICMP echo keys carry the echo id as both ports, so a request from the other side
	 * with the same id finds the entry too: only requests in the original direction and
	 * replies in the reply direction belong to it; anything else is a new exchange */
	if ((pkt->flags & PKT_F_ICMP) &&
	    ((pkt->icmp_type == pkt_echo_request(pkt) && !orig_dir) ||
	     (pkt->icmp_type == pkt_echo_reply(pkt) && orig_dir)))
		return 0;
	if (ct_expired(v, pkt->proto, now)) {
		count_global(GCNT_CT_EXPIRED);
		return 0;
	}
	if (pkt->proto == PF_IPPROTO_TCP) {
		__u8 tf = pkt->tcp_flags;
		int closed = (flags & CT_F_RST) ||
			     ((flags & (CT_F_FIN_ORIG | CT_F_FIN_REPLY)) ==
			      (CT_F_FIN_ORIG | CT_F_FIN_REPLY));
		if (closed && (tf & (PF_TCP_SYN | PF_TCP_ACK)) == PF_TCP_SYN)
			return 0; /* a new connection reusing the tuple: policy decides */
		__u32 add = 0;
		if (tf & PF_TCP_RST)
			add |= CT_F_RST;
		if (tf & PF_TCP_FIN)
			add |= orig_dir ? CT_F_FIN_ORIG : CT_F_FIN_REPLY;
		if (!orig_dir)
			add |= CT_F_SEEN_REPLY;
		/* plain store: a concurrent update of another bit may rarely be lost, which only
		 * affects the timeout class (LLVM 14's BPF target has no 32-bit atomic OR) */
		if (add & ~flags)
			v->flags = flags | add;
	} else if (!orig_dir && !(flags & CT_F_SEEN_REPLY)) {
		v->flags = flags | CT_F_SEEN_REPLY;
	}
	/* plain stores: per-flow statistics may miss a count when two CPUs race, which is
	 * cheaper than locked adds on every established packet */
	v->last_seen_ns = now;
	v->packets += 1;
	v->bytes += pkt->len;
	*reply = !orig_dir;
	/* only replies need the reverse NAT; the client's own packets are translated before */
	return (flags & CT_F_SVC_NAT) && !orig_dir ? CT_HIT_SVC_NAT : CT_HIT;
}

/* An ICMP error whose inner packet belongs to a live flow tracked at this interface? */
PF_INLINE int ct_is_related(struct pkt_info *pkt, __u32 ifindex, __u64 now)
{
	if (!(pkt->flags & PKT_F_ICMP_ERR))
		return 0;
	struct ct_key key = {};
	ct_fill_key(&key, ifindex, &pkt->inner_src, &pkt->inner_dst, pkt->inner_sport,
		    pkt->inner_dport, pkt->inner_proto, 4 + 2 * pkt_v6_bit(pkt));
	struct ct_value *v = conntrack.lookup(&key);
	if (!v || ct_expired(v, pkt->inner_proto, now))
		return 0;
	return 1;
}

/* Record a new flow whose first packet policy allowed. */
PF_INLINE void ct_create(struct pkt_info *pkt, __u32 ifindex, __u8 hook, __u64 now,
			 __u32 counter_id)
{
	struct ct_key key = {};
	int a_to_b = ct_fill_pkt_key(&key, ifindex, pkt);
	struct ct_value v = {};
	v.created_ns = now;
	v.last_seen_ns = now;
	v.packets = 1;
	v.bytes = pkt->len;
	v.counter_id = counter_id;
	if (a_to_b)
		v.flags |= CT_F_ORIG_A_TO_B;
	if (hook == HOOK_TO_WEP)
		v.flags |= CT_F_ORIG_TO_WEP;
	if (pkt->flags & PKT_F_SVC_NAT)
		v.flags |= CT_F_SVC_NAT;
	if (pkt->proto == PF_IPPROTO_TCP) {
		__u8 tf = pkt->tcp_flags;
		if ((tf & (PF_TCP_SYN | PF_TCP_ACK)) != PF_TCP_SYN)
			v.flags |= CT_F_SEEN_REPLY; /* picked up mid-stream: assume established */
		if (tf & PF_TCP_RST)
			v.flags |= CT_F_RST;
		if (tf & PF_TCP_FIN)
			v.flags |= CT_F_FIN_ORIG;
	}
	if (conntrack.update(&key, &v) == 0)
		count_global(GCNT_CT_CREATED);
	else
		count_global(GCNT_CT_CREATE_FAILED);
}

#endif /* PYFELIX_CONNTRACK_H */
