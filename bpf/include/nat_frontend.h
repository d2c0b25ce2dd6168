/* nat_frontend.h: service frontends, (virtual IP, port, protocol) -> service.
 *
 * Python twin: agent/bpf/maps/nat_frontend.py (struct nat_fe_key / nat_fe_value and the
 * NAT_FE_F_* flags must match). Written by BpfNatManager; read by nat.h.
 *
 * A frontend with count == 0 is a Service without ready backends: its traffic is rejected
 * (ICMP port unreachable, as kube-proxy's REJECT), not dropped into a timeout.
 */
#ifndef PYFELIX_NAT_FRONTEND_H
#define PYFELIX_NAT_FRONTEND_H

#include "common.h"

#ifndef NAT_FRONTEND_MAX_ENTRIES
#define NAT_FRONTEND_MAX_ENTRIES 65536
#endif

#define NAT_FE_F_AFFINITY 0x01 /* ClientIP session affinity (affinity_timeout seconds) */
#define NAT_FE_F_EXTERNAL 0x02 /* an external / load balancer IP (not a ClusterIP) */
#define NAT_FE_F_NODEPORT 0x04 /* a NodePort: key address 0 = any of this node's (nat.h) */

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
};

BPF_TABLE_PINNED("hash", struct nat_fe_key, struct nat_fe_value, nat_frontend,
		 NAT_FRONTEND_MAX_ENTRIES, PIN_DIR "/nat_frontend_v1");

#endif /* PYFELIX_NAT_FRONTEND_H */
