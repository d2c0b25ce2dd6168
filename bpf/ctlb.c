/* ctlb.c: connect-time load balancing for host-networked clients (cgroup v2 programs).
 *
 * A process in the node's own network namespace that connects to a Service's cluster or
 * external IP never crosses a workload interface, so the tc NAT (nat.h) never sees it. As
 * Calico's BPF mode does, these programs translate at the socket instead, attached to the
 * cgroup v2 directory of BPFCgroupV2 (managers/bpf_ctlb.py):
 *
 *   calico_connect4      connect() on an IPv4 TCP socket (and UDP when CFG_CTLB_UDP):
 *                        (VIP, port, protocol) in nat_frontend -> a backend, chosen as the
 *                        tc NAT chooses it (ClientIP affinity keyed by client 0 = this host,
 *                        else uniform), written into the socket address before the kernel
 *                        routes it; no backend: connect() fails at once (EPERM);
 *   calico_sendmsg4      the same for unconnected UDP sendmsg() (CFG_CTLB_UDP only);
 *   calico_recvmsg4      a datagram from a translated backend shows the VIP as its source;
 *   calico_getpeername4  a translated socket's peer shows as the VIP.
 *
 * The packets then carry the backend's address from the first one: the backend's ingress
 * policy (calico_to_wep on this node, or the backend's node) sees the real destination and
 * this host as the source. Anything that is not a service address is left alone (return 1).
 */
#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "nat_frontend.h"
#include "nat_backend.h"
#include "nat_affinity.h"
#include "ctlb.h"

#define CTLB_ALLOW 1
#define CTLB_REFUSE 0

PF_INLINE int ctlb_udp_enabled(void)
{
	__u32 zero = 0;
	struct config_value *cfg = config.lookup(&zero);
	return cfg && (cfg->flags & CFG_CTLB_UDP);
}

PF_INLINE int ctlb_translate(struct bpf_sock_addr *ctx, __u8 proto)
{
	struct nat_fe_key fe_key = {};
	fe_key.addr = ctx->user_ip4;
	fe_key.port = pf_ntohs((__u16)ctx->user_port);
	fe_key.proto = proto;
	struct nat_fe_value *fe = nat_frontend.lookup(&fe_key);
	if (!fe)
		return CTLB_ALLOW;
	if (fe->count == 0)
		return CTLB_REFUSE; /* a Service without endpoints: refused at once */

	struct nat_be_value *be = 0;
	__u64 now = ct_now_ns();
	struct nat_aff_key aff_key = {};
	if (fe->flags & NAT_FE_F_AFFINITY) {
		aff_key.service_id = fe->service_id;
		aff_key.client = 0; /* this host */
		struct nat_aff_value *aff = nat_affinity.lookup(&aff_key);
		if (aff && now - aff->last_used_ns < (__u64)fe->affinity_timeout * 1000000000ULL) {
			aff->last_used_ns = now;
			ctx->user_ip4 = aff->addr;
			ctx->user_port = pf_htons(aff->port);
			goto record;
		}
	}
	be = nat_fe_backend(fe, bpf_get_prandom_u32() % fe->count);
	if (!be)
		return CTLB_REFUSE; /* between two writes of an update: the client retries */
	if (fe->flags & NAT_FE_F_AFFINITY) {
		struct nat_aff_value aff_new = {};
		aff_new.addr = be->addr;
		aff_new.port = be->port;
		aff_new.last_used_ns = now;
		nat_affinity.update(&aff_key, &aff_new);
	}
	ctx->user_ip4 = be->addr;
	ctx->user_port = pf_htons(be->port);
record:;
	struct ctlb_rev_key rev_key = {};
	rev_key.cookie = bpf_get_socket_cookie(ctx);
	rev_key.addr = ctx->user_ip4;
	rev_key.port = (__be16)ctx->user_port;
	rev_key.proto = proto;
	struct ctlb_rev_value rev = {};
	rev.vip = fe_key.addr;
	rev.vport = pf_htons(fe_key.port);
	ctlb_rev.update(&rev_key, &rev);
	return CTLB_ALLOW;
}

PF_INLINE void ctlb_reverse(struct bpf_sock_addr *ctx, __u8 proto)
{
	struct ctlb_rev_key key = {};
	key.cookie = bpf_get_socket_cookie(ctx);
	key.addr = ctx->user_ip4;
	key.port = (__be16)ctx->user_port;
	key.proto = proto;
	struct ctlb_rev_value *rev = ctlb_rev.lookup(&key);
	if (rev) {
		ctx->user_ip4 = rev->vip;
		ctx->user_port = rev->vport;
	}
}

int calico_connect4(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol == PF_IPPROTO_TCP)
		return ctlb_translate(ctx, PF_IPPROTO_TCP);
	if (ctx->protocol == PF_IPPROTO_UDP && ctlb_udp_enabled())
		return ctlb_translate(ctx, PF_IPPROTO_UDP);
	return CTLB_ALLOW;
}

int calico_sendmsg4(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol == PF_IPPROTO_UDP && ctlb_udp_enabled())
		return ctlb_translate(ctx, PF_IPPROTO_UDP);
	return CTLB_ALLOW;
}

int calico_recvmsg4(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol == PF_IPPROTO_UDP)
		ctlb_reverse(ctx, PF_IPPROTO_UDP);
	return CTLB_ALLOW;
}

int calico_getpeername4(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol == PF_IPPROTO_TCP || ctx->protocol == PF_IPPROTO_UDP)
		ctlb_reverse(ctx, (__u8)ctx->protocol);
	return CTLB_ALLOW;
}
