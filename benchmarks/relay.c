/* benchmarks/floor.py's relay, compiled: the same wire and the same flow control as floor.cmd_relay, with
 * no interpreter in the two middle processes. It answers "what would a compiled service reach" for issue 10:
 * the ``relay-c`` row of the floor section (docs/userspace-profile.md).
 *
 *   relay TAG listen - [PORT]    |    relay TAG connect PEER_IPV4 [PORT]
 *
 * One client on the abstract AF_UNIX SOCK_SEQPACKET name "\0pyrds-floor-TAG"; one TCP connection to the
 * other namespace's relay on PORT (default 17000, floor.RELAY_TCP_PORT), each message framed by a
 * 4-byte big-endian length, TCP_NODELAY. Prints "ready" once the TCP connection is up (as the Python relay
 * does), then relays until either side goes away. A full TCP send buffer stops reading the client; a client
 * that does not read stops reading TCP. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_MSG (1 << 20)      /* RDS_MAX_MSG_SIZE: a client message is never larger */
#define OUT_HIGH (1 << 20)     /* stop reading the client above this many framed bytes for TCP */
#define OUT_CAP (OUT_HIGH + 2 * (MAX_MSG + 8))
#define TCP_CHUNK (1 << 18)
#define IN_CAP (MAX_MSG + 4 + TCP_CHUNK)

static char outbuf[OUT_CAP];
static size_t out_off, out_len;
static char inbuf[IN_CAP];
static size_t in_off, in_len;

static _Noreturn void die(const char *what) {
    perror(what);
    exit(2);
}

static void set_interest(int ep, int fd, uint32_t *have, uint32_t want) {
    if (*have == want)
        return; /* an epoll_ctl only when the interest changes */
    struct epoll_event ev = {.events = want, .data.fd = fd};
    int op = !*have ? EPOLL_CTL_ADD : !want ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
    if (epoll_ctl(ep, op, fd, op == EPOLL_CTL_DEL ? NULL : &ev) < 0)
        die("epoll_ctl");
    *have = want;
}

/* 0: all written or would block; -1: the connection is gone */
static int flush_tcp(int tcp) {
    while (out_off < out_len) {
        ssize_t n = send(tcp, outbuf + out_off, out_len - out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                return -1;
            memmove(outbuf, outbuf + out_off, out_len - out_off); /* room for a whole message after it */
            out_len -= out_off;
            out_off = 0;
            return 0;
        }
        out_off += (size_t)n;
    }
    out_off = out_len = 0;
    return 0;
}

/* whole frames from TCP to the client while it has room: 1 if the client is full, 0 if all went, -1 gone */
static int deliver(int client) {
    while (in_len - in_off >= 4) {
        uint32_t n;
        memcpy(&n, inbuf + in_off, 4);
        n = ntohl(n);
        if (n > MAX_MSG)
            return -1;
        if (in_len - in_off < 4 + (size_t)n)
            break;
        if (send(client, inbuf + in_off + 4, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            return errno == EAGAIN || errno == EINTR ? 1 : -1;
        in_off += 4 + (size_t)n;
    }
    if (in_off) { /* keep the partial frame at the start */
        memmove(inbuf, inbuf + in_off, in_len - in_off);
        in_len -= in_off;
        in_off = 0;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s TAG listen|connect PEER [PORT]\n", argv[0]);
        return 2;
    }
    int port = argc == 5 ? atoi(argv[4]) : 17000;
    if (port <= 0 || port > 65535)
        die("port");
    int listen_mode = strcmp(argv[2], "listen") == 0;

    int lst = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    if (lst < 0)
        die("socket");
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    int nlen = snprintf(un.sun_path + 1, sizeof un.sun_path - 1, "pyrds-floor-%s", argv[1]);
    if (nlen < 0 || (size_t)nlen >= sizeof un.sun_path - 1)
        die("tag");
    socklen_t ulen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)nlen);
    if (bind(lst, (struct sockaddr *)&un, ulen) < 0 || listen(lst, 1) < 0)
        die("bind unix");

    int tcp;
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (listen_mode) {
        int tl = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        if (tl < 0 || setsockopt(tl, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
            die("tcp listener");
        in.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(tl, (struct sockaddr *)&in, sizeof in) < 0 || listen(tl, 1) < 0)
            die("bind tcp");
        printf("ready\n");
        fflush(stdout);
        tcp = accept(tl, NULL, NULL);
        if (tcp < 0)
            die("accept");
        close(tl);
    } else {
        if (inet_pton(AF_INET, argv[3], &in.sin_addr) != 1)
            die("peer");
        struct timespec pause = {0, 50 * 1000 * 1000};
        for (int tries = 0;; tries++) { /* the listening relay may still be starting */
            tcp = socket(AF_INET, SOCK_STREAM, 0);
            if (tcp < 0)
                die("socket");
            if (connect(tcp, (struct sockaddr *)&in, sizeof in) == 0)
                break;
            if (errno != ECONNREFUSED || tries > 200)
                die("connect");
            close(tcp);
            nanosleep(&pause, NULL);
        }
        printf("ready\n");
        fflush(stdout);
    }
    int one = 1;
    if (setsockopt(tcp, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        die("TCP_NODELAY");
    int client = accept(lst, NULL, NULL);
    if (client < 0)
        die("accept unix");

    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");
    uint32_t have_client = 0, have_tcp = 0;
    int client_full = 0;
    for (;;) {
        set_interest(ep, client, &have_client,
                     (out_len - out_off < OUT_HIGH ? EPOLLIN : 0) | (client_full ? EPOLLOUT : 0));
        set_interest(ep, tcp, &have_tcp, (client_full ? 0 : EPOLLIN) | (out_len > out_off ? EPOLLOUT : 0));
        struct epoll_event evs[4];
        int n = epoll_wait(ep, evs, 4, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            uint32_t e = evs[i].events;
            if (evs[i].data.fd == client) {
                if (e & EPOLLOUT) {
                    int r = deliver(client);
                    if (r < 0)
                        return 0;
                    client_full = r;
                }
                if (e & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                    for (int k = 0; k < 64 && out_len - out_off < OUT_HIGH; k++) {
                        ssize_t got = recv(client, outbuf + out_len + 4, MAX_MSG + 1, MSG_DONTWAIT);
                        if (got < 0) {
                            if (errno == EAGAIN || errno == EINTR)
                                break;
                            return 0;
                        }
                        if (got == 0 && (e & (EPOLLHUP | EPOLLERR)))
                            return 0; /* the client went away (a 0-byte message has no HUP) */
                        uint32_t be = htonl((uint32_t)got);
                        memcpy(outbuf + out_len, &be, 4);
                        out_len += 4 + (size_t)got;
                    }
                }
            } else {
                if (e & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                    ssize_t got = recv(tcp, inbuf + in_len, IN_CAP - in_len < TCP_CHUNK ? IN_CAP - in_len
                                                                                        : TCP_CHUNK,
                                       MSG_DONTWAIT);
                    if (got == 0)
                        return 0;
                    if (got < 0 && errno != EAGAIN && errno != EINTR)
                        return 0;
                    if (got > 0)
                        in_len += (size_t)got;
                    int r = deliver(client);
                    if (r < 0)
                        return 0;
                    client_full = r;
                }
            }
        }
        if (flush_tcp(tcp) < 0)
            return 0;
    }
}
