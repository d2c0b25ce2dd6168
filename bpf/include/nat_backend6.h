/* nat_backend6.h: IPv6 service backends, (service id, index) -> backend address and port.
 *
 * Python twin: agent/bpf/maps/nat_backend6.py. The key is nat_backend.h's struct
 * nat_be_key (ids of nat_frontend6's own key space). Written by BpfNatManager in the same
 * make-before-break order as nat_backend (nat_backend.h).
 */
#ifndef PYFELIX_NAT_BACKEND6_H
#define PYFELIX_NAT_BACKEND6_H

#include "common.h"
#include "nat_backend.h"

#ifndef NAT_BACKEND6_MAX_ENTRIES
#define NAT_BACKEND6_MAX_ENTRIES 262144
#endif

struct nat_be6_value {
	struct pf_addr addr;
	__u16 port; /* host byte order */
	__u16 pad;
};

BPF_TABLE_PINNED("hash", struct nat_be_key, struct nat_be6_value, nat_backend6,
		 NAT_BACKEND6_MAX_ENTRIES, PIN_DIR "/nat_backend6_v1");

#endif /* PYFELIX_NAT_BACKEND6_H */
