/* endpoints.h: workload endpoints by ifindex of their host-side interface.
 *
 * Python twin: agent/bpf/maps/endpoints.py (struct endpoint_key / endpoint_value must match).
 *
 * Each endpoint names two policy chains in the rules array (policy.h), one per direction of
 * the POD: ingress (evaluated by calico_to_wep, tc egress of the host veth) and egress
 * (calico_from_wep, tc ingress of the host veth). A chain is [start, start + len) in the
 * rules array; endpoints with identical policy share one chain. A chain of length 0 denies
 * everything that conntrack does not allow.
 *
 * endpoint_id indexes ep_counters (counters.h); its name is in the ids map (kind ENDPOINT).
 * A tc program that finds no entry for its ifindex drops the packet (fail closed).
 *
 * ep_by_ifindex (Python twin: agent/bpf/maps/ep_by_ifindex.py) mirrors the hash for every
 * ifindex below its size, each mirrored value flagged EP_F_PRESENT: an array lookup the
 * verifier inlines instead of a hash lookup (~27 ns here) on every packet. The manager
 * writes a slot with its hash entry and clears it (all zeros) before deleting the entry,
 * so a PRESENT slot never outlives the endpoint; the hash stays the map of record.
 */
#ifndef PYFELIX_ENDPOINTS_H
#define PYFELIX_ENDPOINTS_H

#include "common.h"

#ifndef ENDPOINTS_MAX_ENTRIES
#define ENDPOINTS_MAX_ENTRIES 16384
#endif

#ifndef EP_BY_IFINDEX_MAX_ENTRIES
#define EP_BY_IFINDEX_MAX_ENTRIES 65536
#endif

#define EP_F_ADMIN_DOWN 0x01 /* endpoint state is not "active": drop everything */
#define EP_F_PRESENT 0x02    /* ep_by_ifindex only: this slot mirrors an endpoints entry */

struct endpoint_key {
	__u32 ifindex;
};

struct endpoint_value {
	__u32 endpoint_id;
	__u32 flags; /* EP_F_* */
	__u32 ingress_start;
	__u32 ingress_len;
	__u32 egress_start;
	__u32 egress_len;
};

BPF_TABLE_PINNED("hash", struct endpoint_key, struct endpoint_value, endpoints,
		 ENDPOINTS_MAX_ENTRIES, PIN_DIR "/endpoints_v1");
BPF_TABLE_PINNED("array", __u32, struct endpoint_value, ep_by_ifindex,
		 EP_BY_IFINDEX_MAX_ENTRIES, PIN_DIR "/ep_by_ifindex_v1");

/* The endpoint of ifindex: its ep_by_ifindex slot when that mirrors an entry (an array
 * lookup the verifier inlines: no hashing), else the endpoints hash. */
PF_INLINE struct endpoint_value *lookup_endpoint(__u32 ifindex)
{
	if (ifindex < EP_BY_IFINDEX_MAX_ENTRIES) {
		struct endpoint_value *slot = ep_by_ifindex.lookup(&ifindex);
		if (slot && (slot->flags & EP_F_PRESENT))
			return slot;
	}
	struct endpoint_key ek = {};
	ek.ifindex = ifindex;
	return endpoints.lookup(&ek);
}

#endif /* PYFELIX_ENDPOINTS_H */
