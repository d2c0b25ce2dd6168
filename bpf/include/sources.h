/* sources.h: the source prefixes each workload may send from (reverse-path filtering).
 *
 * Python twin: agent/bpf/maps/wep_sources.py (struct wep_source_key / wep_source_value).
 *
 * Key = (ifindex of the workload's host-side interface, source prefix). The compiler writes,
 * for every programmed workload endpoint, its own addresses (ipNetworks) and its
 * allowSpoofedSourcePrefixes. calico_from_wep drops (and counts) every IPv4 packet whose
 * source matches no entry of its interface, before conntrack and policy: a pod cannot take
 * another pod's identity (its allow rules, its IP-set memberships), a host address, or an
 * address outside every pool. An endpoint with no entries (no IPv4 address) sends no IPv4.
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

#define WEP_SOURCE_KEY_FIXED_BITS 32 /* ifindex */

struct wep_source_key {
	__u32 prefixlen; /* WEP_SOURCE_KEY_FIXED_BITS + source prefix length */
	__u32 ifindex;
	__be32 saddr;
};

struct wep_source_value {
	__u32 flags; /* reserved, 0 */
};

BPF_TABLE_PINNED7("lpm_trie", struct wep_source_key, struct wep_source_value, wep_sources,
		  WEP_SOURCES_MAX_ENTRIES, PIN_DIR "/wep_sources_v1", BPF_F_NO_PREALLOC);

/* May the workload behind ifindex send from saddr? */
PF_INLINE int wep_source_allowed(__u32 ifindex, __be32 saddr)
{
	struct wep_source_key k = {};
	k.prefixlen = WEP_SOURCE_KEY_FIXED_BITS + 32;
	k.ifindex = ifindex;
	k.saddr = saddr;
	return wep_sources.lookup(&k) != 0;
}

#endif /* PYFELIX_SOURCES_H */
