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
 */
#ifndef PYFELIX_ENDPOINTS_H
#define PYFELIX_ENDPOINTS_H

#include "common.h"

#ifndef ENDPOINTS_MAX_ENTRIES
#define ENDPOINTS_MAX_ENTRIES 16384
#endif

#define EP_F_ADMIN_DOWN 0x01 /* endpoint state is not "active": drop everything */

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

#endif /* PYFELIX_ENDPOINTS_H */
