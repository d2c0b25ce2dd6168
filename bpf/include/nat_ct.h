/* nat_ct.h: the NAT of each service flow, so later packets and replies are translated alike.
 *
 * Python twin: agent/bpf/maps/nat_ct.py. Written by the programs (nat.h); an LRU, so it
 * never refuses a flow. Two entries per flow, both keyed by a packet's own tuple:
 *   NAT_CT_FWD  (client, VIP, client port, service port)   -> (backend, backend port)
 *               used at calico_from_wep for the client's packets (DNAT);
 *   NAT_CT_REV  (backend, client, backend port, client port) -> (VIP, service port)
 *               used at calico_to_wep for the replies (source back to the VIP).
 * NodePort flows (NAT_CT_F_NODEPORT, nat.h "NodePorts") use the same two kinds, keyed at the
 * host interface: FWD (client, node address, client port, node port) -> backend; REV
 * (backend, client, ...) -> (node address, node port), or, source-NATed to the node
 * (NAT_CT_F_SNAT: a backend on another node), REV (backend, node address, backend port,
 * SNAT port) -> (node address, node port) with the client in peer_addr / peer_port.
 * The flow's policy state stays in conntrack.h, keyed by the translated tuple, so egress
 * policy saw the backend and the backend's ingress policy saw the client.
 */
#ifndef PYFELIX_NAT_CT_H
#define PYFELIX_NAT_CT_H

#include "common.h"

#ifndef NAT_CT_MAX_ENTRIES
#define NAT_CT_MAX_ENTRIES 262144
#endif

#define NAT_CT_FWD 1
#define NAT_CT_REV 2

struct nat_ct_key {
	__be32 saddr;
	__be32 daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 kind; /* NAT_CT_FWD / NAT_CT_REV */
	__u8 pad[2];
};

#define NAT_CT_F_HAIRPIN 0x01  /* the client is its own backend (see nat.h, hairpin) */
#define NAT_CT_F_NODEPORT 0x02 /* a NodePort flow from a host interface (nat.h, NodePorts) */
#define NAT_CT_F_SNAT 0x04     /* ... also source-NATed to the node (backend on another node) */

struct nat_ct_value {
	__be32 addr; /* FWD: the backend; REV: the VIP */
	__u16 port;
	__u16 flags; /* NAT_CT_F_* */
	__u64 created_ns;
	__u64 last_seen_ns;
	/* NAT_CT_F_SNAT only: FWD: the new source (node address, SNAT port); REV: the new
	 * destination (the client's address and port) */
	__be32 peer_addr;
	__u16 peer_port;
	__u16 pad;
};

BPF_TABLE_PINNED("lru_hash", struct nat_ct_key, struct nat_ct_value, nat_ct,
		 NAT_CT_MAX_ENTRIES, PIN_DIR "/nat_ct_v2");

#endif /* PYFELIX_NAT_CT_H */
