/* xdp.c: calico_xdp, early drop on host interfaces for untracked (doNotTrack) deny rules.
 *
 * Parses IPv4 (common.h); anything else, and malformed packets, PASS (the stack and the tc
 * programs deal with them). Looks up (ingress ifindex, source address), then (0, source
 * address), in the `untracked` LPM trie (untracked.h): a hit is XDP_DROP, counted against
 * the deny rule's counter; a miss is XDP_PASS.
 */
#include "common.h"
#include "counters.h"
#include "untracked.h"

int calico_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct pkt_info pkt = {};
	if (parse_packet(data, data_end, &pkt) != PARSE_OK)
		return XDP_PASS;

	struct untracked_key key = {};
	key.prefixlen = UNTRACKED_KEY_FIXED_BITS + pkt_addr_bits(&pkt);
	key.ifindex = ctx->ingress_ifindex;
	key.family = 4 + 2 * pkt_v6_bit(&pkt);
	__builtin_memcpy(&key.saddr, &pkt.src, 16);
	struct untracked_value *v = untracked.lookup(&key);
	if (!v) {
		key.ifindex = 0;
		v = untracked.lookup(&key);
	}
	if (v) {
		count_rule(v->counter_id, (__u32)(data_end - data));
		count_global(GCNT_XDP_DROPPED);
		return XDP_DROP;
	}
	count_global(GCNT_XDP_PASSED);
	return XDP_PASS;
}
