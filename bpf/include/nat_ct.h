/* nat_ct.h: the NAT of each service flow, so later packets and replies are translated alike.
 *
 * Python twin: agent/bpf/maps/nat_ct.py. Written by the programs (nat.h); an LRU, so it
 * never refuses a flow. Two entries per flow, both keyed by a packet's own tuple:
 *   NAT_CT_FWD  (client, VIP, client port, service port)   -> (backend, backend port)
 *               used at calico_from_wep for the client's packets (DNAT);
 *   NAT_CT_REV  (backend, client, backend port, client port) -> (VIP, service port)
 *               used at calico_to_wep for the replies (source back to the VIP).
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

#define NAT_CT_F_HAIRPIN 0x01 /* the client is its own backend (see nat.h, hairpin) */

struct nat_ct_value {
	__be32 addr; /* FWD: the backend; REV: the VIP */
	__u16 port;
	__u16 flags; /* NAT_CT_F_* */
	__u64 created_ns;
	__u64 last_seen_ns;
};

BPF_TABLE_PINNED("lru_hash", struct nat_ct_key, struct nat_ct_value, nat_ct,
		 NAT_CT_MAX_ENTRIES, PIN_DIR "/nat_ct_v1");

#endif /* PYFELIX_NAT_CT_H */
