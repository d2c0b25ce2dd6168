/* ids.h: the names behind the numeric ids Python allocates (never read by the programs).
 *
 * Python twin: agent/bpf/maps/ids.py (struct id_key / id_value must match).
 *
 * The programs only see numbers: IP-set ids, rule counter ids, endpoint ids. Python keeps
 * the name -> number allocation HERE, pinned with the other maps, so that a restarted agent
 * (or the CLI) can recover it: the new agent reuses every id it finds, so nothing that the
 * programs reference changes meaning across a restart.
 * Names longer than ID_NAME_LEN - 1 bytes are stored as "sha256:<hex digest>" of the name.
 */
#ifndef PYFELIX_IDS_H
#define PYFELIX_IDS_H

#include "common.h"

#ifndef IDS_MAX_ENTRIES
#define IDS_MAX_ENTRIES 131072
#endif

#define ID_NAME_LEN 120

#define ID_KIND_IPSET 1    /* an IP set from the calculation graph (IPSetUpdate.id) */
#define ID_KIND_NETSET 2   /* a set made by the compiler from a rule's nets */
#define ID_KIND_RULE 3     /* a rule counter (rule_counters index) */
#define ID_KIND_ENDPOINT 4 /* an endpoint (ep_counters index) */

struct id_key {
	__u32 kind; /* ID_KIND_* */
	__u32 id;
};

struct id_value {
	char name[ID_NAME_LEN]; /* NUL-padded UTF-8 */
};

BPF_TABLE_PINNED("hash", struct id_key, struct id_value, ids, IDS_MAX_ENTRIES,
		 PIN_DIR "/ids_v1");

#endif /* PYFELIX_IDS_H */
