/* nat_ct6.h: the NAT of each IPv6 service flow, so later packets and replies are
 * translated alike (the IPv6 twin of nat_ct.h, same two kinds NAT_CT_FWD / NAT_CT_REV,
 * both keyed by a packet's own tuple):
 *   FWD (client, VIP, client port, service port)   -> (backend, backend port)
 *   REV (backend, client, backend port, client port) -> (VIP, service port)
 * NodePort flows (NAT_CT_F_NODEPORT, nat6.h "NodePorts") as nat_ct.h's: FWD (client, node
 * address, client port, node port) -> backend; REV (backend, client, ...) -> (node address,
 * node port), or with NAT_CT_F_SNAT (a backend on another node) REV (backend, node address,
 * backend port, SNAT port) -> (node address, node port), the client in peer_addr/peer_port.
 * Python twin: agent/bpf/maps/nat_ct6.py. Written by the programs (nat6.h); an LRU.
 * The flow's policy state stays in conntrack.h (family-neutral), keyed by the translated
 * tuple, so egress policy saw the backend and the backend's ingress policy the client.
 */
#ifndef PYFELIX_NAT_CT6_H
#define PYFELIX_NAT_CT6_H

#include "common.h"
#include "nat_ct.h"

#ifndef NAT_CT6_MAX_ENTRIES
#define NAT_CT6_MAX_ENTRIES 262144
#endif

struct nat_ct6_key {
	struct pf_addr saddr;
	struct pf_addr daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 kind; /* NAT_CT_FWD / NAT_CT_REV */
	__u8 pad[2];
};

struct nat_ct6_value {
	struct pf_addr addr; /* FWD: the backend; REV: the VIP or node address */
	__u16 port;
	__u16 flags; /* NAT_CT_F_* (nat_ct.h) */
	__u16 peer_port;
	__u16 pad;
	__u64 created_ns;
	__u64 last_seen_ns;
	/* NAT_CT_F_SNAT only: FWD: the new source (node address, SNAT port in peer_port);
	 * REV: the new destination (the client's address and port) */
	struct pf_addr peer_addr;
};

BPF_TABLE_PINNED("lru_hash", struct nat_ct6_key, struct nat_ct6_value, nat_ct6,
		 NAT_CT6_MAX_ENTRIES, PIN_DIR "/nat_ct6_v2");

#endif /* PYFELIX_NAT_CT6_H */
