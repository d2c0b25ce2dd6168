/* nat_frontend.h: service frontends, (virtual IP, port, protocol) -> service.
 *
 * Python twin: agent/bpf/maps/nat_frontend.py (struct nat_fe_key / nat_fe_value and the
 * NAT_FE_F_* flags must match). Written by BpfNatManager; read by nat.h.
 *
 * A frontend with count == 0 is a Service without ready backends: its traffic is rejected
 * (ICMP port unreachable, as kube-proxy's REJECT), not dropped into a timeout.
 *
 * The value also carries a copy of the service's first NAT_FE_INLINE_BACKENDS backends
 * (indexes [0, min(count, NAT_FE_INLINE_BACKENDS))), so a new flow to a service with that
 * few backends (most Services) picks its backend from the frontend entry it has just read:
 * no second, dependent hash lookup in nat_backend. With thousands of Services spread over
 * megabytes of map memory, each such lookup is a cache and TLB miss (its bucket and its
 * element), the part of a first packet's cost that grows with the number of Services.
 * nat_backend still holds every backend (indexes [0, count)); the program reads it only for
 * indexes >= NAT_FE_INLINE_BACKENDS (nat_fe_backend). A frontend entry is replaced whole, so
 * its count and its inline backends change together.
 * Why 7: the value is then 72 bytes, and with the key and the kernel's 48-byte hash element
 * header (Linux 6.x) an element is exactly 128 bytes; preallocated elements sit at multiples
 * of 128 in a page-aligned area, so the hash, key, count and any inline backend a lookup
 * reads lie in one aligned pair of cache lines (which the CPU fetches together).
 */
#ifndef PYFELIX_NAT_FRONTEND_H
#define PYFELIX_NAT_FRONTEND_H

#include "common.h"
#include "nat_backend.h"

#ifndef NAT_FRONTEND_MAX_ENTRIES
#define NAT_FRONTEND_MAX_ENTRIES 65536
#endif

#define NAT_FE_F_AFFINITY 0x01 /* ClientIP session affinity (affinity_timeout seconds) */
#define NAT_FE_F_EXTERNAL 0x02 /* an external / load balancer IP (not a ClusterIP) */
#define NAT_FE_F_NODEPORT 0x04 /* a NodePort: key address 0 = any of this node's (nat.h) */

#define NAT_FE_INLINE_BACKENDS 7 /* backends copied into the frontend value (see above) */

struct nat_fe_key {
	__be32 addr;
	__u16 port; /* host byte order */
	__u8 proto;
	__u8 pad;
};

struct nat_fe_value {
	__u32 service_id;       /* nat_backend key space; never 0 */
	__u32 count;            /* backends at indexes [0, count) */
	__u32 flags;            /* NAT_FE_F_* */
	__u32 affinity_timeout; /* seconds */
	/* indexes [0, min(count, NAT_FE_INLINE_BACKENDS)), as in nat_backend; the rest zero */
	struct nat_be_value backends[NAT_FE_INLINE_BACKENDS];
};

BPF_TABLE_PINNED("hash", struct nat_fe_key, struct nat_fe_value, nat_frontend,
		  NAT_FRONTEND_MAX_ENTRIES, PIN_DIR "/nat_frontend_v2");

/* The backend at `index` (< fe->count) of a frontend: its inline copy for the first
 * NAT_FE_INLINE_BACKENDS, else nat_backend's entry (NULL when missing: between two writes of
 * an update). */
PF_INLINE struct nat_be_value *nat_fe_backend(struct nat_fe_value *fe, __u32 index)
{
	if (index < NAT_FE_INLINE_BACKENDS)
		return &fe->backends[index];
	struct nat_be_key bk = {};
	bk.service_id = fe->service_id;
	bk.index = index;
	return nat_backend.lookup(&bk);
}

#endif /* PYFELIX_NAT_FRONTEND_H */
