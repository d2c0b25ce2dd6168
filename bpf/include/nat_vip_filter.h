/* nat_vip_filter.h: a bit per hash of an address that may be a service VIP.
 *
 * Python twin: agent/bpf/maps/nat_vip_filter.py (the hash and the layout must match).
 * Every packet from a pod is checked against the service frontends; most are not service
 * traffic, and an array lookup (inlined by the verifier) costs far less than the frontend
 * hash lookup, which runs only when the destination's bit is set. A bit shared by another
 * address only costs that address a hash lookup. BpfNatManager sets a VIP's bit BEFORE its
 * frontend is written and clears it only AFTER the frontend is gone, so a live frontend's
 * bit is always set.
 */
#ifndef PYFELIX_NAT_VIP_FILTER_H
#define PYFELIX_NAT_VIP_FILTER_H

#include "common.h"

#ifndef NAT_VIP_FILTER_MAX_ENTRIES
#define NAT_VIP_FILTER_MAX_ENTRIES 1024 /* u64 words: 65,536 bits */
#endif
#define NAT_VIP_FILTER_BITS (NAT_VIP_FILTER_MAX_ENTRIES * 64)

BPF_TABLE_PINNED("array", __u32, __u64, nat_vip_filter, NAT_VIP_FILTER_MAX_ENTRIES,
		 PIN_DIR "/nat_vip_filter_v1");

/* May daddr be a frontend's VIP? (0: certainly not) */
PF_INLINE int nat_maybe_vip(__be32 daddr)
{
	__u32 bit = ((pf_ntohl(daddr) * 2654435761u) >> 16) % NAT_VIP_FILTER_BITS;
	__u32 word = bit / 64;
	__u64 *w = nat_vip_filter.lookup(&word);
	return w && (*w & (1ULL << (bit % 64)));
}

#endif /* PYFELIX_NAT_VIP_FILTER_H */
