/* denied_sources.h: packets and bytes policy denied, per (deciding rule counter, source).
 *
 * Python twin: agent/bpf/maps/denied_sources.py (structs denied_key / denied_value).
 *
 * Felix's calico_denied_packets / calico_denied_bytes (labels policy and srcIP) are read
 * from here at scrape time. An LRU hash: its size bounds the label sets the metrics can
 * have (the least recently denied (rule, source) pairs are evicted first). Written only on
 * the deny path of policy_verdict (tc.c): allowed traffic never touches it.
 */
#ifndef PYFELIX_DENIED_SOURCES_H
#define PYFELIX_DENIED_SOURCES_H

#include "common.h"

#ifndef DENIED_SOURCES_MAX_ENTRIES
#define DENIED_SOURCES_MAX_ENTRIES 4096
#endif

struct denied_key {
	__u32 counter_id; /* the deciding record's rule counter (ids.h kind RULE); 0 = none */
	__u32 saddr;      /* network byte order */
};

struct denied_value {
	__u64 packets;
	__u64 bytes;
};

BPF_TABLE_PINNED("lru_hash", struct denied_key, struct denied_value, denied_sources,
		 DENIED_SOURCES_MAX_ENTRIES, PIN_DIR "/denied_sources_v1");

PF_INLINE void count_denied_source(__u32 counter_id, __u32 saddr, __u32 len)
{
	struct denied_key key = {.counter_id = counter_id, .saddr = saddr};
	struct denied_value *v = denied_sources.lookup(&key);
	if (v) {
		__sync_fetch_and_add(&v->packets, 1);
		__sync_fetch_and_add(&v->bytes, len);
		return;
	}
	struct denied_value fresh = {.packets = 1, .bytes = len};
	denied_sources.update(&key, &fresh);
}

#endif /* PYFELIX_DENIED_SOURCES_H */
