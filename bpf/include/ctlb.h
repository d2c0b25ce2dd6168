/* ctlb.h: connect-time load balancing's reverse map (ctlb.c).
 *
 * Python twin: agent/bpf/maps/ctlb_rev.py (struct ctlb_rev_key / ctlb_rev_value must match).
 *
 * When calico_connect4 / calico_sendmsg4 turn a socket's service address (VIP, port) into a
 * backend, they record (socket cookie, backend, port, protocol) -> (VIP, port). The
 * getpeername and recvmsg hooks of the same socket look it up to show the application the
 * address it asked for, as a kube-proxy DNAT would have (a UDP client checks that replies
 * come from the address it sent to). An LRU map: entries of closed sockets age out.
 */
#ifndef PYFELIX_CTLB_H
#define PYFELIX_CTLB_H

#include "common.h"

#ifndef CTLB_REV_MAX_ENTRIES
#define CTLB_REV_MAX_ENTRIES 65536
#endif

struct ctlb_rev_key {
	__u64 cookie;   /* bpf_get_socket_cookie */
	__be32 addr;    /* the backend */
	__be16 port;    /* network byte order, as struct bpf_sock_addr has it */
	__u8 proto;
	__u8 pad;
};

struct ctlb_rev_value {
	__be32 vip;
	__be16 vport;   /* network byte order */
	__u16 pad;
};

BPF_TABLE_PINNED("lru_hash", struct ctlb_rev_key, struct ctlb_rev_value, ctlb_rev,
		 CTLB_REV_MAX_ENTRIES, PIN_DIR "/ctlb_rev_v1");

#endif /* PYFELIX_CTLB_H */
