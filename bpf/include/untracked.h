/* untracked.h: early-drop prefixes for XDP on host interfaces (doNotTrack deny rules).
 *
 * Python twin: agent/bpf/maps/untracked.py (struct untracked_key / untracked_value).
 *
 * Key = (ifindex, source prefix); ifindex 0 applies to every interface running calico_xdp
 * (a host endpoint named "*"). The compiler fills it only from the LEADING deny rules of a
 * host endpoint's untracked (doNotTrack) inbound chain whose sole constraint is a source
 * (nets, or one selector whose members it expands): those are exactly the rules that deny
 * a packet before any other rule could allow it, so dropping in XDP is always correct.
 * Everything else in untracked policy is not enforced by XDP (see bpf/README.md).
 */
#ifndef PYFELIX_UNTRACKED_H
#define PYFELIX_UNTRACKED_H

#include "common.h"

#ifndef UNTRACKED_MAX_ENTRIES
#define UNTRACKED_MAX_ENTRIES 65536
#endif

#define UNTRACKED_KEY_FIXED_BITS 64 /* ifindex + family */

struct untracked_key {
	__u32 prefixlen; /* UNTRACKED_KEY_FIXED_BITS + source prefix length */
	__u32 ifindex;
	__u32 family;         /* 4 or 6 */
	struct pf_addr saddr; /* IPv4: the first 4 bytes, the rest 0 */
};

struct untracked_value {
	__u32 counter_id; /* rule_counters index of the deny rule */
	__u32 flags;      /* reserved, 0 */
};

BPF_TABLE_PINNED7("lpm_trie", struct untracked_key, struct untracked_value, untracked,
		  UNTRACKED_MAX_ENTRIES, PIN_DIR "/untracked_v2", BPF_F_NO_PREALLOC);

#endif /* PYFELIX_UNTRACKED_H */
