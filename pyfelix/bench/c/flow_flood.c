/* flow_flood.c: a flood of new UDP flows, for the flow-log overload test
 * (tests/privileged/lab/flow_flood.py).
 *
 *   flow_flood IFNAME DST_MAC SRC DST RATE COUNT [DPORTS [FIRST_DPORT [CPU]]]
 *
 * Run inside the sending pod's network namespace. Sends COUNT Ethernet/IPv4/UDP frames,
 * RATE a second, out of IFNAME (the pod's interface, whose own MAC is the source MAC) to
 * DST_MAC (the pod's gateway: the host side of its veth), from SRC (the pod's own address:
 * the dataplane's source check drops any other) to DST, each a new 5-tuple: for each source
 * port (1024..65535, then again) the destination port steps through FIRST_DPORT (default 1)
 * .. FIRST_DPORT + DPORTS - 1 (default 64 ports), so ~4 million frames pass before a tuple
 * repeats; senders given disjoint destination port ranges never share a tuple. IP and UDP
 * checksums are right (the UDP one kept up incrementally from the ports).
 *
 * Why a packet socket: the frames are built here, so the sending side costs no socket
 * lookup, routing, neighbour or IP output per packet; PACKET_QDISC_BYPASS skips the pod
 * interface's qdisc too, and sendmmsg() hands BATCH frames to the kernel per system call.
 * What remains per frame is the veth hop and the receiving side: the node's dataplane (tc
 * programs or iptables/conntrack/NFLOG), which the veth runs in softirq on this process's
 * CPU, that is, the cost the flood is meant to load. CPU (optional) pins the process there.
 *
 * The rate is paced per batch against the monotonic clock: a sender that keeps up takes
 * COUNT / RATE seconds, one that falls behind longer (it gives up at three times that plus a
 * second). Prints "<frames sent> <seconds taken> <send errors>" and exits 0; a failed send
 * (e.g. ENOBUFS) is counted and its frames sent again, not fatal. "Sent" is what the kernel
 * accepted: callers count what reached the peer from its interface counters.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 256
#define PAYLOAD 16

struct __attribute__((packed)) frame {
	struct ether_header eth;
	struct iphdr ip;
	struct udphdr udp;
	unsigned char payload[PAYLOAD];
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Ones' complement sum of 16-bit words (network order as stored), not yet folded. */
static unsigned long sum16(const void *data, int len, unsigned long sum)
{
	const unsigned char *p = data;
	for (; len > 1; len -= 2, p += 2)
		sum += (unsigned)(p[0] << 8 | p[1]);
	if (len)
		sum += (unsigned)(p[0] << 8);
	return sum;
}

static unsigned short fold(unsigned long sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (unsigned short)sum;
}

static int parse_mac(const char *text, unsigned char mac[6])
{
	unsigned v[6];
	if (sscanf(text, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6)
		return -1;
	for (int i = 0; i < 6; i++) {
		if (v[i] > 255)
			return -1;
		mac[i] = (unsigned char)v[i];
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 7) {
		fprintf(stderr, "usage: %s IFNAME DST_MAC SRC DST RATE COUNT "
				"[DPORTS [FIRST_DPORT [CPU]]]\n", argv[0]);
		return 2;
	}
	const char *ifname = argv[1];
	unsigned char dst_mac[6];
	struct in_addr src, dst;
	if (parse_mac(argv[2], dst_mac) != 0) {
		fprintf(stderr, "bad DST_MAC %s\n", argv[2]);
		return 2;
	}
	if (inet_pton(AF_INET, argv[3], &src) != 1 || inet_pton(AF_INET, argv[4], &dst) != 1) {
		fprintf(stderr, "bad SRC or DST address\n");
		return 2;
	}
	double rate = atof(argv[5]);
	long count = atol(argv[6]);
	int dports = argc > 7 ? atoi(argv[7]) : 64;
	int first = argc > 8 ? atoi(argv[8]) : 1;
	int cpu = argc > 9 ? atoi(argv[9]) : -1;
	if (rate <= 0 || count <= 0 || dports < 1 || first < 1 || first + dports - 1 > 65535) {
		fprintf(stderr, "bad RATE, COUNT, DPORTS or FIRST_DPORT\n");
		return 2;
	}
	if (cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) != 0) {
			perror("sched_setaffinity");
			return 1;
		}
	}

	/* protocol 0: this socket sends only, nothing received is queued to it */
	int fd = socket(AF_PACKET, SOCK_RAW, 0);
	if (fd < 0) {
		perror("socket(AF_PACKET)");
		return 1;
	}
	struct ifreq ifr;
	memset(&ifr, 0, sizeof(ifr));
	if (strlen(ifname) >= sizeof(ifr.ifr_name)) {
		fprintf(stderr, "bad IFNAME %s\n", ifname);
		return 2;
	}
	strcpy(ifr.ifr_name, ifname);
	if (ioctl(fd, SIOCGIFINDEX, &ifr) != 0) {
		perror(ifname);
		return 1;
	}
	int ifindex = ifr.ifr_ifindex;
	if (ioctl(fd, SIOCGIFHWADDR, &ifr) != 0) {
		perror("SIOCGIFHWADDR");
		return 1;
	}
	unsigned char src_mac[6];
	memcpy(src_mac, ifr.ifr_hwaddr.sa_data, 6);
	struct sockaddr_ll bound = {.sll_family = AF_PACKET, .sll_ifindex = ifindex};
	if (bind(fd, (struct sockaddr *)&bound, sizeof(bound)) != 0) {
		perror("bind");
		return 1;
	}
	int one = 1, sndbuf = 4 << 20;
	if (setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one)) != 0) {
		perror("PACKET_QDISC_BYPASS");
		return 1;
	}
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));

	static struct frame frames[BATCH];
	static struct iovec iov[BATCH];
	static struct mmsghdr msgs[BATCH];
	struct frame proto;
	memset(&proto, 0, sizeof(proto));
	memcpy(proto.eth.ether_dhost, dst_mac, 6);
	memcpy(proto.eth.ether_shost, src_mac, 6);
	proto.eth.ether_type = htons(ETHERTYPE_IP);
	proto.ip.version = 4;
	proto.ip.ihl = 5;
	proto.ip.ttl = 64;
	proto.ip.protocol = IPPROTO_UDP;
	proto.ip.tot_len = htons(sizeof(struct iphdr) + sizeof(struct udphdr) + PAYLOAD);
	proto.ip.saddr = src.s_addr;
	proto.ip.daddr = dst.s_addr;
	proto.udp.len = htons(sizeof(struct udphdr) + PAYLOAD);
	memcpy(proto.payload, "pyfelix-flood...", PAYLOAD);
	/* the UDP checksum's constant part: pseudo-header (addresses, protocol, length), the
	 * UDP length field and the payload; each frame adds its two ports */
	unsigned long udp_base = 0;
	udp_base = sum16(&proto.ip.saddr, 8, udp_base);
	udp_base += IPPROTO_UDP + ntohs(proto.udp.len) + ntohs(proto.udp.len);
	udp_base = sum16(proto.payload, PAYLOAD, udp_base);
	/* the IP checksum's constant part: the header without id and checksum */
	unsigned long ip_base = sum16(&proto.ip, sizeof(struct iphdr), 0);
	for (int i = 0; i < BATCH; i++) {
		frames[i] = proto;
		iov[i].iov_base = &frames[i];
		iov[i].iov_len = sizeof(struct frame);
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}

	unsigned sport = 1024, dport = first, id = 0;
	long sent = 0, errors = 0;
	double start = now(), give_up = start + 3 * count / rate + 1;
	while (sent < count) {
		double t = now();
		if (t >= give_up)
			break;
		double due = start + sent / rate; /* pace: the next batch's start */
		if (t < due) {
			struct timespec ts = {0, (long)((due - t) * 1e9)};
			nanosleep(&ts, NULL);
			continue;
		}
		int batch = count - sent < BATCH ? (int)(count - sent) : BATCH;
		for (int i = 0; i < batch; i++) {
			struct frame *f = &frames[i];
			unsigned short ip_id = (unsigned short)id++;
			f->ip.id = htons(ip_id);
			f->ip.check = htons((unsigned short)~fold(ip_base + ip_id));
			f->udp.source = htons(sport);
			f->udp.dest = htons(dport);
			unsigned short udp_sum = (unsigned short)~fold(udp_base + sport + dport);
			f->udp.check = htons(udp_sum ? udp_sum : 0xffff); /* 0 means "none" */
			if (++dport >= (unsigned)(first + dports)) {
				dport = first;
				if (++sport > 65535)
					sport = 1024;
			}
		}
		int n = sendmmsg(fd, msgs, batch, 0);
		if (n < batch)
			errors += 1; /* the unsent frames' tuples are skipped, still never repeated */
		if (n > 0)
			sent += n;
	}
	printf("%ld %.6f %ld\n", sent, now() - start, errors);
	close(fd);
	return 0;
}
