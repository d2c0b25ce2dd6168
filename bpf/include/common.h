/* common.h: shared definitions and packet parsing for pyfelix's tc and XDP programs.
 *
 * Everything here is compiled by BCC as part of ONE module (bpf/module.c), with
 * `-I bpf/include` and these macros from the loader (agent/bpf/loader.py):
 *   PIN_DIR       "/sys/fs/bpf/<dir>"  where data maps are pinned (string literal)
 *   PROG_ABI      "<hex>"              a hash of the sources; names the pins of the
 *                                      maps private to one build (prog array, scratch)
 *   <MAP>_MAX_ENTRIES                   per-map sizes (defaults in each map's header)
 *   POLICY_RULES_PER_PROG               rule records walked per tail call (policy.h)
 *
 * Parsing (parse_packet): Ethernet -> IPv4 (options allowed) or IPv6 -> TCP/UDP/SCTP ports
 * or ICMP / ICMPv6 type/code. IPv6 extension headers (hop-by-hop, routing, destination
 * options, fragment, AH) are walked to the L4 header by a bounded loop (PF_IPV6_MAX_EXT
 * headers, none starting beyond PF_IPV6_MAX_EXT_OFF bytes); a chain longer than that, or
 * one holding an extension header the parser does not walk (mobility, HIP, shim6, the
 * experimental 253/254), is PARSE_V6_EXT (dropped and counted: fail closed). Addresses of
 * both families are in pkt->src / pkt->dst (struct pf_addr: IPv4 in w[0], the rest 0), which
 * the family-neutral code (conntrack, sources, routes, classifier) reads without branching
 * on the family (each such branch doubles the verifier's paths); IPv4 packets also have
 * saddr/daddr, what the service NAT reads and rewrites (it keeps src/dst in step). An IPv6
 * packet has PKT_F_IPV6 and family 6.
 * Anything neither IPv4 nor IPv6 is PARSE_NOT_IP, and `classify_non_ip()` tells the tc
 * programs what it is: ARP passes, the rest drops. A truncated or malformed header is
 * PARSE_MALFORMED (dropped).
 * Fragments, both families: every fragment sets PKT_F_FRAGMENT; non-first fragments carry
 * no L4 header: they are parsed with PKT_F_PORTS / PKT_F_ICMP clear (protocol = the
 * fragmented protocol), so rules with port or ICMP constraints never match them and
 * conntrack cannot find them: they go through policy like any first packet.
 *
 * Ports are kept in HOST byte order everywhere (maps, structs); addresses stay in NETWORK
 * byte order (as on the wire), which is what LPM tries need.
 */
#ifndef PYFELIX_COMMON_H
#define PYFELIX_COMMON_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/icmp.h>
#include <uapi/linux/ipv6.h>

#ifndef PIN_DIR
#error "PIN_DIR must be defined by the loader, e.g. -DPIN_DIR=\"/sys/fs/bpf/pyfelix\""
#endif
#ifndef PROG_ABI
#error "PROG_ABI must be defined by the loader (a hash of the sources)"
#endif

#define PF_INLINE static __always_inline

#define pf_ntohs(x) __builtin_bswap16(x)
#define pf_ntohl(x) __builtin_bswap32(x)
#define pf_htons(x) __builtin_bswap16(x)

/* IP protocol numbers we parse ports for. */
#define PF_IPPROTO_ICMP 1
#define PF_IPPROTO_TCP 6
#define PF_IPPROTO_UDP 17
#define PF_IPPROTO_SCTP 132
#define PF_IPPROTO_ICMPV6 58

/* IPv6 extension headers */
#define PF_IPPROTO_HOPOPTS 0
#define PF_IPPROTO_ROUTING 43
#define PF_IPPROTO_FRAGMENT 44
#define PF_IPPROTO_AH 51
#define PF_IPPROTO_DSTOPTS 60
#define PF_IPPROTO_MH 135 /* mobility: not walked (dropped) */
#define PF_IPPROTO_HIP 139
#define PF_IPPROTO_SHIM6 140

#define PF_IPV6_MAX_EXT 8        /* extension headers walked at most */
#define PF_IPV6_MAX_EXT_OFF 320  /* no extension header may start further into the frame */

/* The two tc hooks of a workload interface (host side of the veth). */
#define HOOK_FROM_WEP 0 /* tc ingress of the host veth: packets the pod SENDS (pod egress) */
#define HOOK_TO_WEP 1   /* tc egress of the host veth: packets the pod RECEIVES (pod ingress) */

/* pkt_info.flags */
#define PKT_F_PORTS 0x01    /* TCP/UDP/SCTP: sport/dport are the packet's ports */
#define PKT_F_FRAGMENT 0x02 /* a fragment (first or not), either family */
#define PKT_F_ICMP_ERR 0x04 /* an ICMP(v6) error carrying an inner header (inner_* valid) */
#define PKT_F_ICMP 0x08     /* ICMP/ICMPv6: icmp_type/icmp_code valid (sport/dport = echo id or 0) */
#define PKT_F_SVC_NAT 0x10  /* DNATed to a service backend (nat.h): conntrack records it */
#define PKT_F_HAIRPIN 0x20  /* a service flow from a pod to itself, forward (nat.h) */
#define PKT_F_HAIRPIN_REPLY 0x40 /* the reply of such a flow, before its reverse NAT */
#define PKT_F_IPV6 0x80     /* an IPv6 packet (pkt_info.family 6); the classifier's L4 key has it */

/* TCP flags as in the TCP header's 13th byte. */
#define PF_TCP_FIN 0x01
#define PF_TCP_SYN 0x02
#define PF_TCP_RST 0x04
#define PF_TCP_ACK 0x10

/* parse_packet() results */
#define PARSE_OK 0
#define PARSE_NOT_IP 1
#define PARSE_MALFORMED 2
#define PARSE_V6_EXT 3 /* an IPv6 extension header chain not walked (unknown, too long) */
#define PARSE_NOT_IPV4 PARSE_NOT_IP

/* An address of either family: IPv4 in w[0] (network order), w[1..3] = 0. */
struct pf_addr {
	__u32 w[4];
};

/* What the programs know about a packet. For ICMP echo request/reply the echo identifier is
 * put in BOTH sport and dport so that a reply's reversed tuple equals the request's tuple.
 * src/dst (both families) and, for IPv4, saddr/daddr (the NAT's view): see the top. */
struct pkt_info {
	__be32 saddr;
	__be32 daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 flags;
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 tcp_flags;
	__u8 family;    /* 4 or 6 */
	__u8 hop_limit; /* IPv6 only */
	__u8 pad;
	__u32 len; /* skb->len / XDP frame length, for byte counters */
	/* inner tuple of an ICMP error (PKT_F_ICMP_ERR) */
	__be32 inner_saddr;
	__be32 inner_daddr;
	__u16 inner_sport;
	__u16 inner_dport;
	__u8 inner_proto;
	__u8 inner_pad[3];
	struct pf_addr src; /* both families */
	struct pf_addr dst;
	struct pf_addr inner_src; /* an ICMP(v6) error's inner addresses, both families */
	struct pf_addr inner_dst;
};

struct pf_l4_ports {
	__be16 source;
	__be16 dest;
};

struct pf_icmp_hdr {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__be16 id;
	__be16 seq;
};

PF_INLINE int icmp_is_error(__u8 type)
{
	/* destination unreachable, source quench, redirect, time exceeded, parameter problem */
	return type == 3 || type == 4 || type == 5 || type == 11 || type == 12;
}

/* ICMPv6 errors: destination unreachable, packet too big, time exceeded, parameter problem */
PF_INLINE int icmp6_is_error(__u8 type)
{
	return type >= 1 && type <= 4;
}

PF_INLINE int pkt_is_v6(const struct pkt_info *pkt)
{
	return pkt->flags & PKT_F_IPV6;
}

/* ICMP echo request / reply of the packet's family */
PF_INLINE __u8 pkt_echo_request(const struct pkt_info *pkt)
{
	return pkt_is_v6(pkt) ? 128 : 8;
}

PF_INLINE __u8 pkt_echo_reply(const struct pkt_info *pkt)
{
	return pkt_is_v6(pkt) ? 129 : 0;
}

PF_INLINE void pf_addr_copy(struct pf_addr *dst, const void *src16)
{
	__builtin_memcpy(dst, src16, 16);
}

/* 1 for IPv6, 0 for IPv4, without a branch */
PF_INLINE __u32 pkt_v6_bit(const struct pkt_info *pkt)
{
	return (pkt->flags >> 7) & 1; /* PKT_F_IPV6 */
}

/* An address's bits: 32 for IPv4, 128 for IPv6 (no branch) */
PF_INLINE __u32 pkt_addr_bits(const struct pkt_info *pkt)
{
	return 32 + 96 * pkt_v6_bit(pkt);
}

/* The ports of an L4 header / the echo id of an ICMP echo (both families). */
PF_INLINE void parse_inner_l4(void *l4, void *data_end, __u8 proto, struct pkt_info *pkt)
{
	if (l4 + 8 > data_end)
		return;
	if (proto == PF_IPPROTO_TCP || proto == PF_IPPROTO_UDP || proto == PF_IPPROTO_SCTP) {
		struct pf_l4_ports *p = l4;
		pkt->inner_sport = pf_ntohs(p->source);
		pkt->inner_dport = pf_ntohs(p->dest);
	} else if (proto == PF_IPPROTO_ICMP || proto == PF_IPPROTO_ICMPV6) {
		struct pf_icmp_hdr *ic = l4;
		if (ic->type == 0 || ic->type == 8 || ic->type == 128 || ic->type == 129) {
			pkt->inner_sport = pf_ntohs(ic->id);
			pkt->inner_dport = pkt->inner_sport;
		}
	}
}

/* Parse the inner IPv4 header + first 8 bytes of an ICMP error's payload. */
PF_INLINE void parse_icmp_inner(void *inner, void *data_end, struct pkt_info *pkt)
{
	struct iphdr *iph = inner;
	if ((void *)(iph + 1) > data_end)
		return;
	if (iph->version != 4 || iph->ihl < 5)
		return;
	__u32 ihl = iph->ihl * 4;
	if (ihl > 60)
		return;
	void *l4 = inner + ihl;
	if (l4 + 8 > data_end)
		return;
	pkt->inner_saddr = iph->saddr;
	pkt->inner_daddr = iph->daddr;
	pkt->inner_src.w[0] = iph->saddr;
	pkt->inner_dst.w[0] = iph->daddr;
	pkt->inner_proto = iph->protocol;
	parse_inner_l4(l4, data_end, iph->protocol, pkt);
	pkt->flags |= PKT_F_ICMP_ERR;
}

/* Parse the inner IPv6 header + first 8 bytes of an ICMPv6 error's payload (an inner
 * packet with extension headers is not matched to a flow: it goes through policy). */
PF_INLINE void parse_icmp6_inner(void *inner, void *data_end, struct pkt_info *pkt)
{
	struct ipv6hdr *ip6 = inner;
	if ((void *)(ip6 + 1) > data_end)
		return;
	if (ip6->version != 6)
		return;
	void *l4 = (void *)(ip6 + 1);
	if (l4 + 8 > data_end)
		return;
	pf_addr_copy(&pkt->inner_src, &ip6->saddr);
	pf_addr_copy(&pkt->inner_dst, &ip6->daddr);
	pkt->inner_proto = ip6->nexthdr;
	parse_inner_l4(l4, data_end, ip6->nexthdr, pkt);
	pkt->flags |= PKT_F_ICMP_ERR;
}

/* The L4 header at l4 (both families). */
PF_INLINE int parse_l4(void *l4, void *data_end, struct pkt_info *pkt)
{
	switch (pkt->proto) {
	case PF_IPPROTO_TCP: {
		struct tcphdr *tcp = l4;
		if ((void *)(tcp + 1) > data_end)
			return PARSE_MALFORMED;
		pkt->sport = pf_ntohs(tcp->source);
		pkt->dport = pf_ntohs(tcp->dest);
		pkt->tcp_flags = ((__u8 *)tcp)[13];
		pkt->flags |= PKT_F_PORTS;
		break;
	}
	case PF_IPPROTO_UDP:
	case PF_IPPROTO_SCTP: {
		struct pf_l4_ports *p = l4;
		if ((void *)(p + 1) > data_end)
			return PARSE_MALFORMED;
		pkt->sport = pf_ntohs(p->source);
		pkt->dport = pf_ntohs(p->dest);
		pkt->flags |= PKT_F_PORTS;
		break;
	}
	case PF_IPPROTO_ICMP:
	case PF_IPPROTO_ICMPV6: {
		/* ICMP in IPv6 or ICMPv6 in IPv4 is just another protocol */
		if ((pkt->proto == PF_IPPROTO_ICMPV6) != (pkt_is_v6(pkt) != 0))
			break;
		struct pf_icmp_hdr *ic = l4;
		if ((void *)(ic + 1) > data_end)
			return PARSE_MALFORMED;
		pkt->icmp_type = ic->type;
		pkt->icmp_code = ic->code;
		pkt->flags |= PKT_F_ICMP;
		if (ic->type == pkt_echo_request(pkt) || ic->type == pkt_echo_reply(pkt)) {
			pkt->sport = pf_ntohs(ic->id);
			pkt->dport = pkt->sport;
		} else if (pkt_is_v6(pkt)) {
			if (icmp6_is_error(ic->type))
				parse_icmp6_inner((void *)(ic + 1), data_end, pkt);
		} else if (icmp_is_error(ic->type)) {
			parse_icmp_inner((void *)(ic + 1), data_end, pkt);
		}
		break;
	}
	default:
		break;
	}
	return PARSE_OK;
}

PF_INLINE int ipv6_is_ext(__u8 next)
{
	return next == PF_IPPROTO_HOPOPTS || next == PF_IPPROTO_ROUTING ||
	       next == PF_IPPROTO_FRAGMENT || next == PF_IPPROTO_AH || next == PF_IPPROTO_DSTOPTS ||
	       next == PF_IPPROTO_MH || next == PF_IPPROTO_HIP || next == PF_IPPROTO_SHIM6 ||
	       next == 253 || next == 254;
}

/* IPv6 after the Ethernet header: walk the extension headers, then the L4 header. */
PF_INLINE int parse_ipv6(void *data, void *data_end, struct pkt_info *pkt)
{
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	if ((void *)(ip6 + 1) > data_end)
		return PARSE_MALFORMED;
	if (ip6->version != 6)
		return PARSE_MALFORMED;
	pkt->family = 6;
	pkt->flags |= PKT_F_IPV6;
	pkt->hop_limit = ip6->hop_limit;
	pf_addr_copy(&pkt->src, &ip6->saddr);
	pf_addr_copy(&pkt->dst, &ip6->daddr);
	__u8 next = ip6->nexthdr;
	__u32 off = sizeof(struct ethhdr) + sizeof(struct ipv6hdr);
#pragma unroll
	for (int i = 0; i < PF_IPV6_MAX_EXT; i++) {
		if (!ipv6_is_ext(next))
			break;
		if (next != PF_IPPROTO_HOPOPTS && next != PF_IPPROTO_ROUTING &&
		    next != PF_IPPROTO_FRAGMENT && next != PF_IPPROTO_AH &&
		    next != PF_IPPROTO_DSTOPTS)
			return PARSE_V6_EXT; /* an extension header we do not walk */
		if (off > PF_IPV6_MAX_EXT_OFF)
			return PARSE_V6_EXT;
		__u8 *h = data + off;
		if ((void *)(h + 8) > data_end) /* every extension header is >= 8 bytes */
			return PARSE_MALFORMED;
		__u8 this = next;
		next = h[0];
		if (this == PF_IPPROTO_FRAGMENT) {
			__u16 fo = ((__u16)h[2] << 8) | h[3]; /* offset << 3 | res | M */
			pkt->flags |= PKT_F_FRAGMENT;
			off += 8;
			if (fo & 0xfff8) { /* not the first fragment: no L4 header */
				pkt->proto = next;
				return PARSE_OK;
			}
		} else if (this == PF_IPPROTO_AH) {
			off += ((__u32)h[1] + 2) * 4;
		} else {
			off += ((__u32)h[1] + 1) * 8;
		}
	}
	if (ipv6_is_ext(next))
		return PARSE_V6_EXT; /* more than PF_IPV6_MAX_EXT extension headers */
	pkt->proto = next;
	if (off > PF_IPV6_MAX_EXT_OFF + 2048)
		return PARSE_MALFORMED;
	off &= 0xfff;
	void *l4 = data + off;
	if (l4 > data_end)
		return PARSE_MALFORMED;
	return parse_l4(l4, data_end, pkt);
}

/* Parse an Ethernet frame in [data, data_end). Fills pkt; returns PARSE_*. */
PF_INLINE int parse_packet(void *data, void *data_end, struct pkt_info *pkt)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return PARSE_MALFORMED;
	if (eth->h_proto == __constant_htons(ETH_P_IPV6))
		return parse_ipv6(data, data_end, pkt);
	if (eth->h_proto != __constant_htons(ETH_P_IP))
		return PARSE_NOT_IP;

	struct iphdr *iph = (void *)(eth + 1);
	if ((void *)(iph + 1) > data_end)
		return PARSE_MALFORMED;
	if (iph->version != 4 || iph->ihl < 5)
		return PARSE_MALFORMED;
	__u32 ihl = iph->ihl * 4;
	if (ihl > 60)
		return PARSE_MALFORMED;
	void *l4 = (void *)iph + ihl;
	if (l4 > data_end)
		return PARSE_MALFORMED;

	pkt->family = 4;
	pkt->saddr = iph->saddr;
	pkt->daddr = iph->daddr;
	pkt->src.w[0] = iph->saddr;
	pkt->dst.w[0] = iph->daddr;
	pkt->proto = iph->protocol;

	__u16 frag = pf_ntohs(iph->frag_off);
	if (frag & 0x3fff) /* MF set or offset != 0 */
		pkt->flags |= PKT_F_FRAGMENT;
	if (frag & 0x1fff) /* not the first fragment: no L4 header */
		return PARSE_OK;
	return parse_l4(l4, data_end, pkt);
}

/* IPv4 only (host endpoint RPF): an IPv6 frame is PARSE_NOT_IP. */
PF_INLINE int parse_ipv4(void *data, void *data_end, struct pkt_info *pkt)
{
	int rc = parse_packet(data, data_end, pkt);
	if (rc == PARSE_OK && pkt_is_v6(pkt))
		return PARSE_NOT_IP;
	if (rc == PARSE_V6_EXT)
		return PARSE_NOT_IP;
	return rc;
}

/* classify_non_ip() results */
#define NON4_OTHER 0   /* not policed: drop */
#define NON4_ARP 1     /* pass */

/* What a frame that is neither IPv4 nor IPv6 is (NON4_*): only ARP may pass. */
PF_INLINE int classify_non_ip(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return NON4_OTHER;
	if (eth->h_proto == __constant_htons(ETH_P_ARP))
		return NON4_ARP;
	return NON4_OTHER;
}

/* Link scope: fe80::/10 unicast or ff02::/16 multicast. */
PF_INLINE int ipv6_link_scope(const struct pf_addr *a)
{
	__u8 b0 = ((const __u8 *)a)[0], b1 = ((const __u8 *)a)[1];
	return (b0 == 0xfe && (b1 & 0xc0) == 0x80) || (b0 == 0xff && b1 == 0x02);
}

/* The ICMPv6 types allowed at a workload hook without policy: MLD (130-132, 143: hop limit
 * 1) both ways; router solicitation (133) only from the workload, router advertisement
 * (134) only to it; neighbour solicitation/advertisement (135, 136) both ways (hop limit
 * 255). Redirects and everything else go through policy. */
PF_INLINE int icmpv6_nd_allowed(__u8 type, __u8 hop_limit, int from_workload)
{
	if (type == 130 || type == 131 || type == 132 || type == 143)
		return hop_limit == 1;
	if (hop_limit != 255)
		return 0;
	if (type == 135 || type == 136)
		return 1;
	return from_workload ? type == 133 : type == 134;
}

/* Link-scope neighbour discovery / MLD, as Felix allows it: passed before the source check
 * and policy (a DAD probe comes from ::, ND from link-local addresses). */
PF_INLINE int ipv6_nd_passes(const struct pkt_info *pkt, int from_workload)
{
	if (!pkt_is_v6(pkt) || pkt->proto != PF_IPPROTO_ICMPV6 || !(pkt->flags & PKT_F_ICMP) ||
	    (pkt->flags & PKT_F_FRAGMENT))
		return 0;
	if (!ipv6_link_scope(&pkt->dst))
		return 0;
	return icmpv6_nd_allowed(pkt->icmp_type, pkt->hop_limit, from_workload);
}

#endif /* PYFELIX_COMMON_H */
