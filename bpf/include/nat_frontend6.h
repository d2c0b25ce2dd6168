/* nat_frontend6.h: IPv6 service frontends, (virtual IP, port, protocol) -> service.
 *
 * Python twin: agent/bpf/maps/nat_frontend6.py (struct nat_fe6_key / nat_fe6_value must
 * match; the flags are nat_frontend.h's NAT_FE_F_*). Written by BpfNatManager (its IPv6
 * instance); read by nat6.h. The IPv6 twin of nat_frontend.h, kept apart as Calico's BPF
 * mode keeps its v6 NAT maps apart, so IPv4 entries and lookups keep their size and cost.
 * A frontend with count == 0 is a Service without ready backends: its traffic is rejected
 * (ICMPv6 port unreachable). No inline backends here (IPv6 Services are fewer; every new
 * flow reads nat_backend6).
 */
#ifndef PYFELIX_NAT_FRONTEND6_H
#define PYFELIX_NAT_FRONTEND6_H

#include "common.h"
#include "nat_frontend.h"

#ifndef NAT_FRONTEND6_MAX_ENTRIES
#define NAT_FRONTEND6_MAX_ENTRIES 65536
#endif

struct nat_fe6_key {
	struct pf_addr addr;
	__u16 port; /* host byte order */
	__u8 proto;
	__u8 pad;
};

struct nat_fe6_value {
	__u32 service_id;       /* nat_backend6 key space; never 0 */
	__u32 count;            /* backends at indexes [0, count) */
	__u32 flags;            /* NAT_FE_F_* (nat_frontend.h) */
	__u32 affinity_timeout; /* seconds */
};

BPF_TABLE_PINNED("hash", struct nat_fe6_key, struct nat_fe6_value, nat_frontend6,
		  NAT_FRONTEND6_MAX_ENTRIES, PIN_DIR "/nat_frontend6_v1");

#endif /* PYFELIX_NAT_FRONTEND6_H */
