/* sources.h: the source prefixes each workload may send from (reverse-path filtering).
 *
 * Python twin: agent/bpf/maps/wep_sources.py (struct wep_source_key / wep_source_value).
 *
 * Key = (ifindex of the workload's host-side interface, source prefix). The compiler writes,
 * for every programmed workload endpoint, its own addresses (ipNetworks) and its
 * allowSpoofedSourcePrefixes. calico_from_wep drops (and counts) every packet whose
 * source matches no entry of its interface, before conntrack and policy: a pod cannot take
 * another pod's identity (its allow rules, its IP-set memberships), a host address, or an
 * address outside every pool. Both families, keyed by family: an endpoint with no IPv6
 * entry (no IPv6 address) sends no IPv6 (other than link-scope ND, passed before this).
 * IPv4 (prefixlen up to 64 + 32) uses the first 4 bytes of saddr, the rest 0.
 *
 * The manager writes an endpoint's entries BEFORE its endpoints entry and deletes them
 * after it, so a programmed endpoint never finds its own address missing.
 */
#ifndef PYFELIX_SOURCES_H
#define PYFELIX_SOURCES_H

#include "common.h"

#ifndef WEP_SOURCES_MAX_ENTRIES
#define WEP_SOURCES_MAX_ENTRIES 65536
#endif

#define WEP_SOURCE_KEY_FIXED_BITS 64 /* ifindex + family */

struct wep_source_key {
	__u32 prefixlen; /* WEP_SOURCE_KEY_FIXED_BITS + source prefix length */
	__u32 ifindex;
	__u32 family; /* 4 or 6 */
	struct pf_addr saddr; /* IPv4: first 4 bytes */
};

struct wep_source_value {
	__u32 flags; /* reserved, 0 */
};

BPF_TABLE_PINNED7("lpm_trie", struct wep_source_key, struct wep_source_value, wep_sources,
		  WEP_SOURCES_MAX_ENTRIES, PIN_DIR "/wep_sources_v2", BPF_F_NO_PREALLOC);

/* May the workload behind ifindex send from the packet's source? */
PF_INLINE int wep_source_allowed(__u32 ifindex, struct pkt_info *pkt)
{
	struct wep_source_key k = {};
	k.prefixlen = WEP_SOURCE_KEY_FIXED_BITS + pkt_addr_bits(pkt);
	k.ifindex = ifindex;
	k.family = 4 + 2 * pkt_v6_bit(pkt);
	__builtin_memcpy(&k.saddr, &pkt->src, 16);
	return wep_sources.lookup(&k) != 0;
}

#endif /* PYFELIX_SOURCES_H */
