/* nat_affinity6.h: IPv6 ClientIP session affinity, (service id, client) -> backend.
 *
 * Python twin: agent/bpf/maps/nat_affinity6.py. The IPv6 twin of nat_affinity.h: written
 * by nat6.h for services with NAT_FE_F_AFFINITY, an entry idle longer than the frontend's
 * timeout is ignored and replaced; BpfNatManager deletes entries whose backend it removed.
 */
#ifndef PYFELIX_NAT_AFFINITY6_H
#define PYFELIX_NAT_AFFINITY6_H

#include "common.h"

#ifndef NAT_AFFINITY6_MAX_ENTRIES
#define NAT_AFFINITY6_MAX_ENTRIES 65536
#endif

struct nat_aff6_key {
	__u32 service_id;
	struct pf_addr client;
};

struct nat_aff6_value {
	struct pf_addr addr;
	__u16 port;
	__u16 pad;
	__u32 pad2;
	__u64 last_used_ns; /* the conntrack clock (ct_now_ns) */
};

BPF_TABLE_PINNED("lru_hash", struct nat_aff6_key, struct nat_aff6_value, nat_affinity6,
		 NAT_AFFINITY6_MAX_ENTRIES, PIN_DIR "/nat_affinity6_v1");

#endif /* PYFELIX_NAT_AFFINITY6_H */
