/* flow_flood.c: a flood of new UDP flows, for the flow-log overload test
 * (tests/privileged/lab/test_lab_flow_flood.py).
 *
 *   flow_flood SRC DST RATE SECONDS [DPORTS [FIRST_DPORT]]
 *
 * Sends RATE IPv4/UDP packets a second for SECONDS from SRC (the sending pod's own address:
 * the source check drops any other) to DST, each a new 5-tuple: source ports cycle through
 * 1024..65535 and, for each turn, the destination port steps through FIRST_DPORT (default
 * 1) .. FIRST_DPORT + DPORTS - 1 (default 64 ports), so ~4 million packets pass before a
 * tuple repeats; several senders given disjoint port ranges never share a tuple. A raw socket (IP_HDRINCL) and
 * sendmmsg() batches of 64 keep it at C speed; the rate is paced per batch against the
 * monotonic clock. Prints "<packets sent> <seconds> <send errors>" and exits 0; a send error
 * (e.g. ENOBUFS with the qdisc full) is counted, not fatal.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define PAYLOAD 16

struct frame {
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

static unsigned short ip_checksum(const void *data, int len)
{
	const unsigned short *p = data;
	unsigned long sum = 0;
	for (; len > 1; len -= 2)
		sum += *p++;
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (unsigned short)~sum;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: %s SRC DST RATE SECONDS [DPORTS [FIRST_DPORT]]\n", argv[0]);
		return 2;
	}
	struct in_addr src, dst;
	if (inet_pton(AF_INET, argv[1], &src) != 1 || inet_pton(AF_INET, argv[2], &dst) != 1) {
		fprintf(stderr, "bad address\n");
		return 2;
	}
	double rate = atof(argv[3]), seconds = atof(argv[4]);
	int dports = argc > 5 ? atoi(argv[5]) : 64;
	int first = argc > 6 ? atoi(argv[6]) : 1;
	if (rate <= 0 || seconds <= 0 || dports < 1 || first < 1 || first + dports - 1 > 65535) {
		fprintf(stderr, "bad rate, seconds or dports\n");
		return 2;
	}
	int fd = socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
	if (fd < 0) {
		perror("socket");
		return 1;
	}
	int sndbuf = 4 << 20;
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));

	static struct frame frames[BATCH];
	static struct iovec iov[BATCH];
	static struct mmsghdr msgs[BATCH];
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr = dst};
	for (int i = 0; i < BATCH; i++) {
		struct frame *f = &frames[i];
		memset(f, 0, sizeof(*f));
		f->ip.version = 4;
		f->ip.ihl = 5;
		f->ip.ttl = 64;
		f->ip.protocol = IPPROTO_UDP;
		f->ip.tot_len = htons(sizeof(*f));
		f->ip.saddr = src.s_addr;
		f->ip.daddr = dst.s_addr;
		f->udp.len = htons(sizeof(struct udphdr) + PAYLOAD);
		memcpy(f->payload, "pyfelix-flood...", PAYLOAD);
		iov[i].iov_base = f;
		iov[i].iov_len = sizeof(*f);
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
		msgs[i].msg_hdr.msg_name = &to;
		msgs[i].msg_hdr.msg_namelen = sizeof(to);
	}

	unsigned sport = 1024, dport = first, id = 0;
	long sent = 0, errors = 0;
	double start = now(), end = start + seconds;
	for (;;) {
		double t = now();
		if (t >= end)
			break;
		double due = start + (sent + errors) / rate; /* pace: the next batch's start */
		if (t < due) {
			struct timespec ts = {0, (long)((due - t) * 1e9)};
			nanosleep(&ts, NULL);
			continue;
		}
		for (int i = 0; i < BATCH; i++) {
			struct frame *f = &frames[i];
			f->ip.id = htons(id++);
			f->udp.source = htons(sport);
			f->udp.dest = htons(dport);
			f->ip.check = 0;
			f->ip.check = ip_checksum(&f->ip, sizeof(f->ip));
			if (++dport >= (unsigned)(first + dports)) {
				dport = first;
				if (++sport > 65535)
					sport = 1024;
			}
		}
		int n = sendmmsg(fd, msgs, BATCH, 0);
		if (n < 0) {
			errors += BATCH;
		} else {
			sent += n;
			errors += BATCH - n;
		}
	}
	printf("%ld %.3f %ld\n", sent, now() - start, errors);
	close(fd);
	return 0;
}
