/* nat_affinity.h: ClientIP session affinity, (service id, client address) -> backend.
 *
 * Python twin: agent/bpf/maps/nat_affinity.py. Written by the programs (nat.h) when a
 * client of a service with NAT_FE_F_AFFINITY opens a flow; an entry older than the
 * frontend's affinity_timeout (since its last use) is ignored and replaced. BpfNatManager
 * deletes a service's entries whose backend it removed (and all of a removed service's).
 */
#ifndef PYFELIX_NAT_AFFINITY_H
#define PYFELIX_NAT_AFFINITY_H

#include "common.h"

#ifndef NAT_AFFINITY_MAX_ENTRIES
#define NAT_AFFINITY_MAX_ENTRIES 65536
#endif

struct nat_aff_key {
	__u32 service_id;
	__be32 client;
};

struct nat_aff_value {
	__be32 addr;
	__u16 port;
	__u16 pad;
	__u64 last_used_ns; /* the conntrack clock (ct_now_ns) */
};

BPF_TABLE_PINNED("lru_hash", struct nat_aff_key, struct nat_aff_value, nat_affinity,
		 NAT_AFFINITY_MAX_ENTRIES, PIN_DIR "/nat_affinity_v1");

#endif /* PYFELIX_NAT_AFFINITY_H */
