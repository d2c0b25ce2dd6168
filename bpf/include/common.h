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
 * Parsing: Ethernet -> IPv4 (options allowed) -> TCP/UDP/SCTP ports or ICMP type/code.
 * Anything that is not IPv4 is reported as PARSE_NOT_IPV4, and `classify_non_ipv4()` tells
 * the tc programs what it is: ARP and link-scope IPv6 neighbour discovery / MLD (what the
 * network needs to work, as Felix allows it) pass; everything else, all other IPv6
 * included, is dropped and counted (fail closed: nothing passes unpoliced). A truncated or
 * malformed IPv4 packet is PARSE_MALFORMED (dropped).
 * Non-first fragments carry no L4 header: they are parsed with PKT_F_PORTS clear, so rules
 * with port constraints never match them and conntrack cannot find them.
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

/* The two tc hooks of a workload interface (host side of the veth). */
#define HOOK_FROM_WEP 0 /* tc ingress of the host veth: packets the pod SENDS (pod egress) */
#define HOOK_TO_WEP 1   /* tc egress of the host veth: packets the pod RECEIVES (pod ingress) */

/* pkt_info.flags */
#define PKT_F_PORTS 0x01    /* TCP/UDP/SCTP: sport/dport are the packet's ports */
#define PKT_F_FRAGMENT 0x02 /* an IPv4 fragment (first or not) */
#define PKT_F_ICMP_ERR 0x04 /* an ICMP error carrying an inner IPv4 header (inner_* valid) */
#define PKT_F_ICMP 0x08     /* ICMP: icmp_type/icmp_code valid (sport/dport = echo id or 0) */
#define PKT_F_SVC_NAT 0x10  /* DNATed to a service backend (nat.h): conntrack records it */
#define PKT_F_HAIRPIN 0x20  /* a service flow from a pod to itself, forward (nat.h) */
#define PKT_F_HAIRPIN_REPLY 0x40 /* the reply of such a flow, before its reverse NAT */

/* TCP flags as in the TCP header's 13th byte. */
#define PF_TCP_FIN 0x01
#define PF_TCP_SYN 0x02
#define PF_TCP_RST 0x04
#define PF_TCP_ACK 0x10

/* parse_ipv4() results */
#define PARSE_OK 0
#define PARSE_NOT_IPV4 1
#define PARSE_MALFORMED 2

/* What the programs know about a packet. For ICMP echo request/reply the echo identifier is
 * put in BOTH sport and dport so that a reply's reversed tuple equals the request's tuple. */
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
	__u8 pad[3];
	__u32 len; /* skb->len / XDP frame length, for byte counters */
	/* inner tuple of an ICMP error (PKT_F_ICMP_ERR) */
	__be32 inner_saddr;
	__be32 inner_daddr;
	__u16 inner_sport;
	__u16 inner_dport;
	__u8 inner_proto;
	__u8 inner_pad[3];
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
	pkt->inner_proto = iph->protocol;
	if (iph->protocol == PF_IPPROTO_TCP || iph->protocol == PF_IPPROTO_UDP ||
	    iph->protocol == PF_IPPROTO_SCTP) {
		struct pf_l4_ports *p = l4;
		pkt->inner_sport = pf_ntohs(p->source);
		pkt->inner_dport = pf_ntohs(p->dest);
	} else if (iph->protocol == PF_IPPROTO_ICMP) {
		struct pf_icmp_hdr *ic = l4;
		if (ic->type == 0 || ic->type == 8) {
			pkt->inner_sport = pf_ntohs(ic->id);
			pkt->inner_dport = pkt->inner_sport;
		}
	}
	pkt->flags |= PKT_F_ICMP_ERR;
}

/* Parse an Ethernet frame in [data, data_end). Fills pkt; returns PARSE_*. */
PF_INLINE int parse_ipv4(void *data, void *data_end, struct pkt_info *pkt)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return PARSE_MALFORMED;
	if (eth->h_proto != __constant_htons(ETH_P_IP))
		return PARSE_NOT_IPV4;

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

	pkt->saddr = iph->saddr;
	pkt->daddr = iph->daddr;
	pkt->proto = iph->protocol;

	__u16 frag = pf_ntohs(iph->frag_off);
	if (frag & 0x3fff) /* MF set or offset != 0 */
		pkt->flags |= PKT_F_FRAGMENT;
	if (frag & 0x1fff) /* not the first fragment: no L4 header */
		return PARSE_OK;

	switch (iph->protocol) {
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
	case PF_IPPROTO_ICMP: {
		struct pf_icmp_hdr *ic = l4;
		if ((void *)(ic + 1) > data_end)
			return PARSE_MALFORMED;
		pkt->icmp_type = ic->type;
		pkt->icmp_code = ic->code;
		pkt->flags |= PKT_F_ICMP;
		if (ic->type == 0 || ic->type == 8) {
			pkt->sport = pf_ntohs(ic->id);
			pkt->dport = pkt->sport;
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

/* classify_non_ipv4() results */
#define NON4_OTHER 0   /* not policed: drop */
#define NON4_ARP 1     /* pass */
#define NON4_IPV6 2    /* IPv6 that is not allowed neighbour discovery: drop */
#define NON4_IPV6_ND 3 /* link-scope neighbour discovery or MLD: pass */

#define PF_IPPROTO_HOPOPTS 0
#define PF_IPPROTO_ICMPV6 58

/* Link scope: fe80::/10 unicast or ff02::/16 multicast. */
PF_INLINE int ipv6_link_scope(const struct in6_addr *a)
{
	__u8 b0 = a->in6_u.u6_addr8[0], b1 = a->in6_u.u6_addr8[1];
	return (b0 == 0xfe && (b1 & 0xc0) == 0x80) || (b0 == 0xff && b1 == 0x02);
}

/* The ICMPv6 types allowed at a workload hook: MLD (130-132, 143: hop limit 1, behind a
 * hop-by-hop header) both ways; router solicitation (133) only from the workload, router
 * advertisement (134) only to it; neighbour solicitation/advertisement (135, 136) both
 * ways (hop limit 255). Redirects and everything else are not allowed. */
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

/* What a frame that is not IPv4 is (NON4_*): only ARP and link-scope ND/MLD may pass. At
 * most one hop-by-hop header is walked (MLD carries one with the router alert option). */
PF_INLINE int classify_non_ipv4(void *data, void *data_end, int from_workload)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return NON4_OTHER;
	if (eth->h_proto == __constant_htons(ETH_P_ARP))
		return NON4_ARP;
	if (eth->h_proto != __constant_htons(ETH_P_IPV6))
		return NON4_OTHER;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > data_end)
		return NON4_IPV6;
	if (!ipv6_link_scope(&ip6->daddr))
		return NON4_IPV6;
	__u8 next = ip6->nexthdr;
	__u8 *l4 = (void *)(ip6 + 1);
	if (next == PF_IPPROTO_HOPOPTS) {
		if (l4 + 2 > (__u8 *)data_end)
			return NON4_IPV6;
		next = l4[0];
		l4 += ((__u32)l4[1] + 1) * 8;
	}
	if (next != PF_IPPROTO_ICMPV6 || l4 + 1 > (__u8 *)data_end)
		return NON4_IPV6;
	return icmpv6_nd_allowed(l4[0], ip6->hop_limit, from_workload) ? NON4_IPV6_ND : NON4_IPV6;
}

#endif /* PYFELIX_COMMON_H */
