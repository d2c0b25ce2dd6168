/* policy.h: policy as data. Rule records, the rules array, and how one record matches.
 *
 * Python twin: agent/bpf/maps/rules.py (struct policy_rule, struct port_match and every
 * RULE_* / RM_* constant must match); the compiler is agent/bpf/compiler.py.
 *
 * A CHAIN is a run of records [start, start + len) in the `rules` array; endpoints.h says
 * which chain each endpoint uses per direction. The compiler flattens, per endpoint and
 * direction:
 *     for each tier (in order) that has policies in this direction:
 *         each policy's rules (in order), then a tier-end DENY record
 *         (no record if the tier's defaultAction is Pass)
 *     each profile's rules (in order)
 *     a final DENY record
 * and the FIRST record that matches decides:
 *     ALLOW / DENY  final verdict;
 *     PASS          continue at `jump` (the start of the next tier, or of the next profile);
 *     LOG           count, continue with the next record;
 *     SKIP          continue at `jump`, uncounted: a "guard" the compiler emits in front of a
 *                   rule whose AND-constraints overflow the fixed slots (see below).
 * `jump` is RELATIVE to the chain start, so a chain's bytes do not depend on where it is
 * placed, and chains are shared by content. Jumps always go forward (a backward jump
 * denies). Walking past the end of the chain denies.
 *
 * A record matches when EVERY constraint whose RM_* bit is set in match_flags holds, and
 * every one of its first n_set_checks set checks holds:
 *   protocol / not_protocol;
 *   set_checks[i]: the source (SET_CHECK_SRC) or destination address is in set set_id, or
 *       NOT in it (SET_CHECK_NEGATE). A rule's nets / notNets become compiler-made sets, its
 *       selectors / notSelectors are IP sets: all are set checks (AND);
 *   *_ports (port_match): the packet has ports (TCP/UDP/SCTP) and the port is in ANY of the
 *       first n_ranges ranges OR (addr, proto, port) is in ANY non-zero named-port set;
 *   not_*_ports: the packet has ports and NONE of the above holds;
 *   icmp_type [+ icmp_code]: the packet is ICMP with that type [and code];
 *   not_icmp_type [+ not_icmp_code]: the packet is ICMP and NOT (type [and code]).
 * Slots are fixed (RULE_*). The compiler handles a rule that needs more:
 *   - more positive port ranges / named-port sets (OR): several records, each with a share
 *     of the alternatives (first match wins, so OR is preserved);
 *   - more set checks (AND) or more negative ports / named ports (AND of "not"): guard
 *     records in front, e.g. "addr NOT in set S -> SKIP past this rule", which skip the
 *     rule exactly when the overflowing constraint fails.
 *
 * Records are not tested one by one at run time: classifier.h indexes a chain's records per
 * packet field, and calico_policy (tc.c) jumps straight to the next record whose every
 * constraint holds. The record fields above are the DEFINITION the index is built from
 * (agent/bpf/classifier.py); the program itself reads only action, jump and counter_id.
 * A chain holds at most POLICY_MAX_CHAIN_RECORDS (CLS_MAX_WORDS * 64) records; the
 * classifier runs CLS_STEPS_PER_PROG steps per program run and tail-calls itself (at most
 * POLICY_MAX_TAIL_CALLS times) to continue.
 */
#ifndef PYFELIX_POLICY_H
#define PYFELIX_POLICY_H

#include "common.h"
#include "ipsets.h"
#include "classifier.h"

#ifndef RULES_MAX_ENTRIES
#define RULES_MAX_ENTRIES 32768
#endif
#define POLICY_MAX_TAIL_CALLS 32
#define POLICY_MAX_CHAIN_RECORDS (CLS_MAX_WORDS * 64)

#define RULE_PORT_SLOTS 8
#define RULE_SET_CHECKS 6
#define RULE_NAMED_PORT_SLOTS 2

#define SET_CHECK_SRC 0x01    /* check the source address (else the destination) */
#define SET_CHECK_NEGATE 0x02 /* the address must NOT be in the set */

#define RULE_ACTION_ALLOW 1
#define RULE_ACTION_DENY 2
#define RULE_ACTION_PASS 3
#define RULE_ACTION_LOG 4
#define RULE_ACTION_SKIP 5

#define RM_PROTOCOL 0x00001
#define RM_NOT_PROTOCOL 0x00002
#define RM_SRC_PORTS 0x00400
#define RM_NOT_SRC_PORTS 0x00800
#define RM_DST_PORTS 0x01000
#define RM_NOT_DST_PORTS 0x02000
#define RM_ICMP_TYPE 0x04000
#define RM_ICMP_CODE 0x08000
#define RM_NOT_ICMP_TYPE 0x10000
#define RM_NOT_ICMP_CODE 0x20000
#define RM_IPV4_ONLY 0x40000 /* the record matches IPv4 only (ipVersion 4, or only IPv4 nets) */
#define RM_IPV6_ONLY 0x80000 /* ... IPv6 only (the classifier's L4 field: PKT_F_IPV6) */

#define RM_ANY_PORTS (RM_SRC_PORTS | RM_NOT_SRC_PORTS | RM_DST_PORTS | RM_NOT_DST_PORTS)
#define RM_ANY_ICMP (RM_ICMP_TYPE | RM_ICMP_CODE | RM_NOT_ICMP_TYPE | RM_NOT_ICMP_CODE)

struct port_range {
	__u16 first; /* inclusive, host byte order */
	__u16 last;  /* inclusive */
};

struct port_match {
	__u8 n_ranges; /* used entries of ranges[] */
	__u8 pad[3];
	__u32 named_sets[RULE_NAMED_PORT_SLOTS]; /* ip_port set ids, 0 = unused */
	struct port_range ranges[RULE_PORT_SLOTS];
};

struct set_check {
	__u32 set_id; /* ipsets.h set id (< 2^31) */
	__u8 flags;   /* SET_CHECK_* */
	__u8 pad[3];
};

struct policy_rule {
	__u32 match_flags; /* RM_* */
	__u8 action;       /* RULE_ACTION_* */
	__u8 protocol;
	__u8 not_protocol;
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 not_icmp_type;
	__u8 not_icmp_code;
	__u8 n_set_checks; /* used entries of set_checks[] */
	__u32 jump;       /* PASS/SKIP: next record index, relative to the chain start */
	__u32 counter_id; /* rule_counters index, 0 = not counted */
	struct set_check set_checks[RULE_SET_CHECKS];
	struct port_match src_ports;
	struct port_match not_src_ports;
	struct port_match dst_ports;
	struct port_match not_dst_ports;
};

BPF_TABLE_PINNED("array", __u32, struct policy_rule, rules, RULES_MAX_ENTRIES,
		 PIN_DIR "/rules_v1");

#define PD_NONE 0     /* not decided yet: continue (tail call) */
#define PD_NO_MATCH 1 /* nothing matched, or an inconsistency: deny */
#define PD_ALLOW 2    /* an ALLOW record decided */
#define PD_DENY 3     /* a DENY record decided */

/* Walker state, carried across tail calls. Private to one build (pinned by PROG_ABI). */
struct policy_state {
	struct pkt_info pkt;
	__u32 ifindex;
	__u32 endpoint_id;
	__u32 chain_start;
	__u32 chain_len;
	__u32 idx; /* next record that may match, relative to chain_start */
	__u32 tail_calls;
	__u8 hook; /* HOOK_* */
	__u8 trace;    /* a `pyfelix explain` packet (verdict_trace.h): record, count nothing */
	__u8 decision; /* PD_*: set when the walk ends; PD_ALLOW/PD_DENY: idx decided */
	__u8 pad;
	__u32 counter_id; /* the deciding record's (PD_ALLOW / PD_DENY) */
	struct cls_state cls; /* classifier.h: the fields' vectors, candidate words */
};

BPF_TABLE_PINNED("percpu_array", __u32, struct policy_state, policy_scratch, 1,
		 PIN_DIR "/scratch_" PROG_ABI);

#define PROG_IDX_POLICY 0
BPF_TABLE_PINNED("prog", __u32, __u32, policy_progs, 4, PIN_DIR "/progs_" PROG_ABI);

#endif /* PYFELIX_POLICY_H */
