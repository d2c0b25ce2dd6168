/* conn_rate.c: the services benchmark's TCP client and server (agent/bench/services.py).
 *
 *   conn_rate serve PORT              accept connections and close them, until killed
 *   conn_rate connect ADDR PORT SECS  open and close connections to ADDR:PORT for SECS
 *                                     seconds, one at a time; print "<count> <seconds>"
 *
 * The client closes with SO_LINGER {1, 0} (an RST, no TIME_WAIT), so a run never runs out
 * of local ports; a connection counts once connect() returned. Any connect() error ends the
 * run with exit status 1 (a rate that includes failures would mean nothing).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int serve(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) || listen(fd, 4096)) {
		perror("bind/listen");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int c = accept(fd, NULL, NULL);
		if (c >= 0)
			close(c);
	}
}

static int connect_loop(const char *ip, int port, double seconds)
{
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (inet_pton(AF_INET, ip, &addr.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", ip);
		return 2;
	}
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	long count = 0;
	double start = now(), end = start + seconds, t = start;
	while (t < end) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) {
			perror("connect");
			close(fd);
			return 1;
		}
		close(fd);
		count++;
		if ((count & 63) == 0)
			t = now();
	}
	printf("%ld %.6f\n", count, now() - start);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "serve"))
		return serve(atoi(argv[2]));
	if (argc == 5 && !strcmp(argv[1], "connect"))
		return connect_loop(argv[2], atoi(argv[3]), atof(argv[4]));
	fprintf(stderr, "usage: conn_rate serve PORT | conn_rate connect ADDR PORT SECONDS\n");
	return 2;
}
