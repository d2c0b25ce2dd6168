/* routes.h: what the dataplane knows about destinations, by longest prefix.
 *
 * Python twin: agent/bpf/maps/routes.py (struct route_key / route_value must match).
 *
 * Entries come from RouteUpdate (local/remote workloads and hosts) and IP pools. The
 * programs use it lightly for now: calico_from_wep looks up the destination of a new flow
 * to apply the endpoint-to-host action (config.h) when RT_F_LOCAL_HOST is set.
 * flags of an entry include the pool flags of every pool containing it (computed by Python),
 * because a longest-prefix match returns one entry only.
 */
#ifndef PYFELIX_ROUTES_H
#define PYFELIX_ROUTES_H

#include "common.h"

#ifndef ROUTES_MAX_ENTRIES
#define ROUTES_MAX_ENTRIES 65536
#endif

#define RT_F_LOCAL_HOST 0x01
#define RT_F_LOCAL_WORKLOAD 0x02
#define RT_F_REMOTE_WORKLOAD 0x04
#define RT_F_REMOTE_HOST 0x08
#define RT_F_IN_POOL 0x10
#define RT_F_NAT_OUTGOING 0x20
#define RT_F_TUNNEL_VXLAN 0x40
#define RT_F_TUNNEL_IPIP 0x80

#define ROUTE_KEY_FIXED_BITS 32 /* family */

/* Both families, keyed by family (IPv4 in the first 4 bytes of addr, the rest 0). */
struct route_key {
	__u32 prefixlen; /* ROUTE_KEY_FIXED_BITS + prefix length */
	__u32 family;    /* 4 or 6 */
	struct pf_addr addr;
};

struct route_value {
	__u32 flags;             /* RT_F_* */
	__u32 ifindex;           /* local workloads: the host-side interface, else 0 */
	struct pf_addr next_hop; /* remote workloads/hosts: the node's address, else 0 */
};

BPF_TABLE_PINNED7("lpm_trie", struct route_key, struct route_value, routes, ROUTES_MAX_ENTRIES,
		  PIN_DIR "/routes_v2", BPF_F_NO_PREALLOC);

/* The flags of the route to the packet's destination (0: no route). */
PF_INLINE __u32 route_flags(struct pkt_info *pkt)
{
	struct route_key key = {};
	key.prefixlen = ROUTE_KEY_FIXED_BITS + pkt_addr_bits(pkt);
	key.family = 4 + 2 * pkt_v6_bit(pkt);
	__builtin_memcpy(&key.addr, &pkt->dst, 16);
	struct route_value *v = routes.lookup(&key);
	return v ? v->flags : 0;
}

#endif /* PYFELIX_ROUTES_H */
