/* nat_backend.h: service backends, (service id, index) -> backend address and port.
 *
 * Python twin: agent/bpf/maps/nat_backend.py. Written by BpfNatManager: when a service's
 * backends change, the new set is written at indexes [0, n) BEFORE the frontend's count
 * changes, and indexes >= n are deleted AFTER, so a packet never picks a missing index.
 */
#ifndef PYFELIX_NAT_BACKEND_H
#define PYFELIX_NAT_BACKEND_H

#include "common.h"

#ifndef NAT_BACKEND_MAX_ENTRIES
#define NAT_BACKEND_MAX_ENTRIES 262144
#endif

struct nat_be_key {
	__u32 service_id;
	__u32 index;
};

struct nat_be_value {
	__be32 addr;
	__u16 port; /* host byte order */
	__u16 pad;
};

BPF_TABLE_PINNED("hash", struct nat_be_key, struct nat_be_value, nat_backend,
		 NAT_BACKEND_MAX_ENTRIES, PIN_DIR "/nat_backend_v1");

#endif /* PYFELIX_NAT_BACKEND_H */
