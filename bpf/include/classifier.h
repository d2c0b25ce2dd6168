/* classifier.h: per-field classification of a chain's records (flat cost in the rule count).
 *
 * Python twins: agent/bpf/maps/cls_chains.py, cls_l4.py, cls_tries.py, cls_words.py (every
 * struct and CLS_* constant must match); the index is built by agent/bpf/classifier.py.
 *
 * A chain (policy.h) is still the ordered list of records the compiler emits, and the
 * records still carry action, jump and counter id. What changed is how the first matching
 * record is found: instead of testing each record, the program asks one question per packet
 * FIELD, and each answer is a bitvector over the chain's records (bit i set = record i's
 * constraints on that field hold). The AND of the answers is the set of matching records;
 * its lowest set bit at or after the current position is the next match (LBVS, as in
 * bpf-iptables). Fields and how each is looked up (INSTANCE = the chain's classifier, see
 * below; "side" = source or destination):
 *   CLS_F_L4      cls_l4 hash: (protocol, has-ports / is-ICMP flags, ICMP type, code), with
 *                 fallbacks (type only, protocol only, "a protocol no record names")
 *   CLS_F_SPORT   cls_tries LPM, side CLS_SIDE_SPORT: port -> elementary port interval
 *   CLS_F_DPORT   the same for the destination port
 *   CLS_F_SADDR   cls_tries LPM, side CLS_SIDE_SADDR: address -> which of the chain's
 *                 source sets (IP sets, nets, notNets) contain it
 *   CLS_F_DADDR   the same for the destination
 *   CLS_F_SNAMED  cls_tries LPM, side CLS_SIDE_SNAMED: (protocol, port, address) -> which
 *                 of the chain's named-port sets contain it
 *   CLS_F_DNAMED  the same for the destination
 * A field no record constrains is not looked up at all (CLS_VEC_ALL); a field whose answer
 * is the same for every packet is not looked up either (its vector is in the header).
 * An LPM/hash miss means "no entry for this value": the field's default vector from the
 * header (e.g. an address in none of the chain's sets).
 *
 * VECTORS live in cls_words (an array of u64), at a base index ("vector id"), SPARSE:
 *     [summary[0..S-1]] [rank[0..S-1]] [the non-zero words, in order]
 * where S = ceil(n_words / 64), bit b of summary[s] says word 64*s+b is non-zero, and
 * rank[s] counts the non-zero words before word 64*s. So a vector costs 2*S + (its non-zero
 * words) u64s, and reading word w is two array loads. The matcher ANDs the fields' summaries
 * once (the candidate words), then, candidate word by candidate word in order, ANDs the
 * fields' words; the first non-zero result gives the record. A rule set of 10,000 records
 * is 157 words, 3 summary words: the candidates are found without touching the 157.
 *
 * INSTANCES. A chain's classifier depends on the chain AND on the members of the IP sets it
 * references, so it changes without the chain changing. Every classifier is written whole
 * (header, vectors, l4 entries, trie entries keyed by its instance) before cls_chains
 * points the chain at it, and deleted only after; one u32 store switches a chain from the
 * old instance to the new one (make before break). The instance id IS the base of its
 * block in cls_words; the block starts with the header:
 *     word 0: n_words (low 32 bits) | flags (high 32 bits: CLS_H_LOOKUP_<field>)
 *     word 1 + f/2: the field's fixed/default vector id (low half for even f)
 *
 * Matching then stops at records: ALLOW/DENY final; PASS/SKIP continue from `jump`; LOG
 * count and continue from the next record (calico_policy in tc.c). Every lookup failure,
 * missing instance or inconsistent header is a drop, counted as GCNT_CLASSIFIER_ERROR.
 */
#ifndef PYFELIX_CLASSIFIER_H
#define PYFELIX_CLASSIFIER_H

#include "common.h"

#ifndef CLS_CHAINS_MAX_ENTRIES
#define CLS_CHAINS_MAX_ENTRIES 32768 /* the loader sizes it as the rules array */
#endif

#ifndef CLS_L4_MAX_ENTRIES
#define CLS_L4_MAX_ENTRIES 65536
#endif
#ifndef CLS_TRIES_MAX_ENTRIES
#define CLS_TRIES_MAX_ENTRIES 1048576
#endif
#ifndef CLS_WORDS_MAX_ENTRIES
#define CLS_WORDS_MAX_ENTRIES 1048576
#endif
#ifndef CLS_STEPS_PER_PROG
#define CLS_STEPS_PER_PROG 8
#endif

#define CLS_MAX_WORDS 512   /* records per chain: 32,768 */
#define CLS_SUMMARY_WORDS 8 /* CLS_MAX_WORDS / 64 */
#define CLS_FIELDS 7
#define CLS_VEC_ALL 0xffffffff /* the field constrains no record: left out of the AND */

#define CLS_F_L4 0
#define CLS_F_SPORT 1
#define CLS_F_DPORT 2
#define CLS_F_SADDR 3
#define CLS_F_DADDR 4
#define CLS_F_SNAMED 5
#define CLS_F_DNAMED 6

/* cls_tries sides; an IPv6 address entry has CLS_SIDE_V6 in its side byte (one trie keyed
 * by family: the address sides of the two families never meet) */
#define CLS_SIDE_V6 0x80
#define CLS_SIDE_SADDR 0
#define CLS_SIDE_DADDR 1
#define CLS_SIDE_SNAMED 2
#define CLS_SIDE_DNAMED 3
#define CLS_SIDE_SPORT 4
#define CLS_SIDE_DPORT 5

/* cls_l4 levels, tried in this order for ICMP (others start at CLS_L4_PROTO) */
#define CLS_L4_TYPE_CODE 2
#define CLS_L4_TYPE 1
#define CLS_L4_PROTO 0
#define CLS_L4_OTHER 3 /* proto 0 in the key: a protocol no record of the chain names */

#define CLS_TRIE_FIXED_BITS 64 /* instance(32) + side(8) + proto(8) + port(16) */

/* cls_chains: chain start (rules index) -> instance (cls_words base); 0 = none (drop) */
BPF_TABLE_PINNED("array", __u32, __u32, cls_chains, CLS_CHAINS_MAX_ENTRIES,
		 PIN_DIR "/cls_chains_v1");

struct cls_l4_key {
	__u32 instance;
	__u8 proto;
	__u8 pflags; /* pkt_info.flags & (PKT_F_PORTS | PKT_F_ICMP | PKT_F_IPV6) */
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 level; /* CLS_L4_* */
	__u8 pad[3];
};

struct cls_vec_value {
	__u32 vec; /* vector id (cls_words base) */
};

BPF_TABLE_PINNED("hash", struct cls_l4_key, struct cls_vec_value, cls_l4, CLS_L4_MAX_ENTRIES,
		 PIN_DIR "/cls_l4_v2");

/* One trie for addresses, named ports and ports. Ports use the address slot: the port in
 * its first 16 bits (network order), so a prefix of the port is a prefix of the key. */
struct cls_trie_key {
	__u32 prefixlen; /* CLS_TRIE_FIXED_BITS + prefix length */
	__u32 instance;
	__u8 side;   /* CLS_SIDE_*, | CLS_SIDE_V6 for IPv6 addresses */
	__u8 proto;  /* named-port sides only */
	__u16 port;  /* named-port sides only; host order (a fixed part of the key) */
	struct pf_addr addr; /* address (IPv4: first 4 bytes), or port << 16 for the port
			      * sides; network order */
};

BPF_TABLE_PINNED7("lpm_trie", struct cls_trie_key, struct cls_vec_value, cls_tries,
		  CLS_TRIES_MAX_ENTRIES, PIN_DIR "/cls_tries_v2", BPF_F_NO_PREALLOC);

BPF_TABLE_PINNED("array", __u32, __u64, cls_words, CLS_WORDS_MAX_ENTRIES,
		 PIN_DIR "/cls_words_v1");

/* Per-packet classifier state, carried across tail calls inside policy_state. */
struct cls_state {
	__u32 n_sum;  /* summary words in use */
	__u32 n_vecs; /* fields in the AND */
	__u32 vecs[CLS_FIELDS];
	__u32 pad;
	__u64 cand[CLS_SUMMARY_WORDS]; /* AND of the summaries, words before pos cleared */
};

PF_INLINE __u64 cls_word(__u32 idx, int *err)
{
	__u64 *w = cls_words.lookup(&idx);
	if (!w) {
		*err = 1;
		return 0;
	}
	return *w;
}

PF_INLINE __u32 cls_popcount(__u64 x)
{
	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (__u32)((x * 0x0101010101010101ULL) >> 56);
}

/* index of the lowest set bit of x != 0 */
PF_INLINE __u32 cls_ctz(__u64 x)
{
	return cls_popcount((x & -x) - 1);
}

PF_INLINE __u32 cls_port_lookup(__u32 instance, __u8 side, __u16 port, __u32 dflt)
{
	struct cls_trie_key key = {};
	key.prefixlen = CLS_TRIE_FIXED_BITS + 16;
	key.instance = instance;
	key.side = side;
	key.addr.w[0] = (__be32)pf_ntohl((__u32)port << 16);
	struct cls_vec_value *v = cls_tries.lookup(&key);
	return v ? v->vec : dflt;
}

/* An address side: addr (the packet's source or destination), in its family's entries
 * (the family from pkt, without a branch). */
PF_INLINE __u32 cls_addr_lookup(__u32 instance, __u8 side, __u8 proto, __u16 port,
				struct pkt_info *pkt, const struct pf_addr *addr, __u32 dflt)
{
	struct cls_trie_key key = {};
	key.prefixlen = CLS_TRIE_FIXED_BITS + pkt_addr_bits(pkt);
	key.instance = instance;
	key.side = side | (pkt_v6_bit(pkt) << 7); /* CLS_SIDE_V6 */
	key.proto = proto;
	key.port = port;
	__builtin_memcpy(&key.addr, addr, 16);
	struct cls_vec_value *v = cls_tries.lookup(&key);
	return v ? v->vec : dflt;
}

PF_INLINE __u32 cls_l4_lookup(__u32 instance, struct pkt_info *pkt, __u32 dflt)
{
	struct cls_l4_key key = {};
	struct cls_vec_value *v;
	key.instance = instance;
	key.proto = pkt->proto;
	key.pflags = pkt->flags & (PKT_F_PORTS | PKT_F_ICMP | PKT_F_IPV6);
	if (key.pflags & PKT_F_ICMP) {
		key.icmp_type = pkt->icmp_type;
		key.icmp_code = pkt->icmp_code;
		key.level = CLS_L4_TYPE_CODE;
		v = cls_l4.lookup(&key);
		if (v)
			return v->vec;
		key.icmp_code = 0;
		key.level = CLS_L4_TYPE;
		v = cls_l4.lookup(&key);
		if (v)
			return v->vec;
		key.icmp_type = 0;
	}
	key.level = CLS_L4_PROTO;
	v = cls_l4.lookup(&key);
	if (v)
		return v->vec;
	key.proto = 0;
	key.level = CLS_L4_OTHER;
	v = cls_l4.lookup(&key);
	return v ? v->vec : dflt;
}

/* Look the packet's fields up and AND the summaries. 0 = ready, -1 = fail closed. */
PF_INLINE int cls_setup(struct cls_state *cs, __u32 chain_start, struct pkt_info *pkt)
{
	__u32 *inst_p = cls_chains.lookup(&chain_start);
	if (!inst_p || !*inst_p)
		return -1;
	__u32 inst = *inst_p;
	int err = 0;
	__u64 head = cls_word(inst, &err);
	__u32 n_words = (__u32)head;
	__u32 flags = (__u32)(head >> 32);
	if (err || n_words == 0 || n_words > CLS_MAX_WORDS)
		return -1;
	__u32 n_sum = (n_words + 63) / 64;
	cs->n_sum = n_sum;
	__u32 fixed[CLS_FIELDS + 1];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u64 w = cls_word(inst + 1 + i, &err);
		fixed[2 * i] = (__u32)w;
		if (2 * i + 1 < CLS_FIELDS + 1)
			fixed[2 * i + 1] = (__u32)(w >> 32);
	}
	if (err)
		return -1;
	if (flags & (1u << CLS_F_L4))
		fixed[CLS_F_L4] = cls_l4_lookup(inst, pkt, fixed[CLS_F_L4]);
	if (flags & (1u << CLS_F_SPORT))
		fixed[CLS_F_SPORT] = cls_port_lookup(inst, CLS_SIDE_SPORT, pkt->sport,
						     fixed[CLS_F_SPORT]);
	if (flags & (1u << CLS_F_DPORT))
		fixed[CLS_F_DPORT] = cls_port_lookup(inst, CLS_SIDE_DPORT, pkt->dport,
						     fixed[CLS_F_DPORT]);
	if (flags & (1u << CLS_F_SADDR))
		fixed[CLS_F_SADDR] = cls_addr_lookup(inst, CLS_SIDE_SADDR, 0, 0, pkt, &pkt->src,
						     fixed[CLS_F_SADDR]);
	if (flags & (1u << CLS_F_DADDR))
		fixed[CLS_F_DADDR] = cls_addr_lookup(inst, CLS_SIDE_DADDR, 0, 0, pkt, &pkt->dst,
						     fixed[CLS_F_DADDR]);
	if (flags & (1u << CLS_F_SNAMED))
		fixed[CLS_F_SNAMED] = cls_addr_lookup(inst, CLS_SIDE_SNAMED, pkt->proto, pkt->sport,
						      pkt, &pkt->src, fixed[CLS_F_SNAMED]);
	if (flags & (1u << CLS_F_DNAMED))
		fixed[CLS_F_DNAMED] = cls_addr_lookup(inst, CLS_SIDE_DNAMED, pkt->proto, pkt->dport,
						      pkt, &pkt->dst, fixed[CLS_F_DNAMED]);
	__u32 n = 0;
#pragma unroll
	for (int f = 0; f < CLS_FIELDS; f++) {
		if (fixed[f] != CLS_VEC_ALL) {
			if (n < CLS_FIELDS)
				cs->vecs[n] = fixed[f];
			n++;
		}
	}
	cs->n_vecs = n;
	/* candidates: every word in use, ANDed with each field's summary */
	for (int s = 0; s < CLS_SUMMARY_WORDS; s++) {
		__u64 c = s < n_sum ? ~0ULL : 0;
		for (int i = 0; i < CLS_FIELDS; i++) {
			if (i >= n || !c)
				break;
			c &= cls_word(cs->vecs[i] + s, &err);
		}
		cs->cand[s] = c;
	}
	return err ? -1 : 0;
}

/* Word w of vector vec (sparse layout above). */
PF_INLINE __u64 cls_vec_word(__u32 vec, __u32 n_sum, __u32 w, int *err)
{
	__u32 s = w / 64;
	__u64 bit = 1ULL << (w % 64);
	__u64 summary = cls_word(vec + s, err);
	if (!(summary & bit))
		return 0;
	__u32 rank = (__u32)cls_word(vec + n_sum + s, err) + cls_popcount(summary & (bit - 1));
	return cls_word(vec + 2 * n_sum + rank, err);
}

/* Clear the candidate words before record `pos`. */
PF_INLINE void cls_advance(struct cls_state *cs, __u32 pos)
{
	__u32 w = pos / 64;
#pragma unroll
	for (int s = 0; s < CLS_SUMMARY_WORDS; s++) {
		if ((__u32)(s + 1) * 64 <= w)
			cs->cand[s] = 0;
		else if ((__u32)s * 64 <= w)
			cs->cand[s] &= ~((1ULL << (w - s * 64)) - 1);
	}
}

#define CLS_FOUND 0
#define CLS_END 1   /* no record at or after pos matches */
#define CLS_MORE 2  /* step budget spent: continue in the next program run */
#define CLS_ERROR 3 /* a lookup failed: fail closed */

/* One step: look at the first candidate word. CLS_FOUND with *idx = the first matching
 * record at or after pos in it, or clears the word and returns CLS_MORE. */
PF_INLINE int cls_step(struct cls_state *cs, __u32 pos, __u32 *idx)
{
	__u32 w = 0;
	__u32 sidx = 0;
	int found = 0;
#pragma unroll
	for (int s = 0; s < CLS_SUMMARY_WORDS; s++) {
		if (!found && cs->cand[s]) {
			sidx = s;
			w = s * 64 + (cls_ctz(cs->cand[s]) & 63);
			found = 1;
		}
	}
	if (!found)
		return CLS_END;
	int err = 0;
	__u64 x = ~0ULL;
	__u32 n = cs->n_vecs;
	__u32 n_sum = cs->n_sum;
	for (int i = 0; i < CLS_FIELDS; i++) {
		if (i >= n || !x)
			break;
		x &= cls_vec_word(cs->vecs[i], n_sum, w, &err);
	}
	if (err)
		return CLS_ERROR;
	if (w == pos / 64)
		x &= ~((1ULL << (pos % 64)) - 1);
	if (!x) {
		cs->cand[sidx & (CLS_SUMMARY_WORDS - 1)] &= ~(1ULL << (w % 64));
		return CLS_MORE;
	}
	*idx = w * 64 + (cls_ctz(x) & 63);
	return CLS_FOUND;
}

#endif /* PYFELIX_CLASSIFIER_H */
