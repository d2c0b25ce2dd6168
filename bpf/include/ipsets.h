/* ipsets.h: every IP set in ONE longest-prefix-match trie.
 *
 * Python twin: agent/bpf/maps/ipsets.py (struct ipset_key / ipset_value must match).
 *
 * Key = (set id, protocol, family, port, prefix): IPv4 and IPv6 members in one trie, the
 * family byte keeping them apart (IPv4 prefixes use the first 4 address bytes). The trie's prefixlen counts bits from
 * set_id onwards, so an entry for member 10.0.0.0/24 of set 7 has
 * prefixlen = IPSET_KEY_FIXED_BITS + 24 and matches any lookup for set 7 with an address in
 * 10.0.0.0/24. set_id, proto, pad and port are always fully covered (IPSET_KEY_FIXED_BITS),
 * so a lookup can only ever match an entry of its own set.
 *   - "net" sets (selectors, network sets, a rule's nets): proto = 0, port = 0.
 *   - "ip_port" sets (named ports): member "10.0.0.1/32,tcp:8080" -> proto 6, port 8080.
 * Set id 0 is never allocated: it means "no set" in rule records.
 * Numeric set ids are allocated by Python; the id -> name mapping is in ids.h.
 */
#ifndef PYFELIX_IPSETS_H
#define PYFELIX_IPSETS_H

#include "common.h"

#ifndef IPSETS_MAX_ENTRIES
#define IPSETS_MAX_ENTRIES 1048576
#endif

#define IPSET_KEY_FIXED_BITS 64 /* set_id(32) + proto(8) + family(8) + port(16) */

struct ipset_key {
	__u32 prefixlen; /* IPSET_KEY_FIXED_BITS + address prefix length */
	__u32 set_id;
	__u8 proto;  /* ip_port sets only, else 0 */
	__u8 family; /* 4 or 6: one trie keyed by family */
	__u16 port;  /* ip_port sets only, else 0; host byte order */
	struct pf_addr addr; /* network byte order; IPv4 in the first 4 bytes, the rest 0 */
};

struct ipset_value {
	__u32 flags; /* reserved, 0 */
};

BPF_TABLE_PINNED7("lpm_trie", struct ipset_key, struct ipset_value, ipsets, IPSETS_MAX_ENTRIES,
		  PIN_DIR "/ipsets_v2", BPF_F_NO_PREALLOC);


#endif /* PYFELIX_IPSETS_H */
