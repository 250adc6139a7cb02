/* benchmarks/floor.py's relay, compiled: the same wire and the same flow control as floor.cmd_relay, with
 * no interpreter in the two middle processes. It answers "what would a compiled service reach" for issue 10:
 * the ``relay-c`` row of the floor section (docs/userspace-profile.md).
 *
 *   relay TAG listen - [PORT [stack]]    |    relay TAG connect PEER_IPV4 [PORT [stack]]
 *
 * One client on the abstract AF_UNIX SOCK_SEQPACKET name "\0pyrds-floor-TAG"; one TCP connection to the
 * other namespace's relay on PORT (default 17000, floor.RELAY_TCP_PORT), each message framed by a
 * 4-byte big-endian length, TCP_NODELAY. Prints "ready" once the TCP connection is up (as the Python relay
 * does), then relays until either side goes away. A full TCP send buffer stops reading the client; a client
 * that does not read stops reading TCP.
 *
 * ``stack`` (both relays alike: the ``relay-c-stack`` row) adds the system calls the userspace stack's
 * service makes per message besides the relay's, so the row answers what a compiled service that keeps
 * them would reach:
 * - a readiness pair over loopback TCP, its client end A handed to the client as the first packet's only
 *   descriptor (SCM_RIGHTS, one byte of data), and one byte into it after every message delivered (the
 *   stack sends one when the socket becomes readable: in request/response, once per message);
 * - SIOCOUTQ on the TCP socket with every write (the stack's ack check, TcpPath.check_acks, which the
 *   service makes 0.6-0.8 times per round trip: one per write overstates it a little);
 * - a 48-byte frame header, the RDS header's size: the length, then a 64-bit sequence number that the
 *   receiving relay checks (a frame out of sequence ends it with status 3), then zeros. */
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
#include <linux/sockios.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_MSG (1 << 20)      /* RDS_MAX_MSG_SIZE: a client message is never larger */
#define OUT_HIGH (1 << 20)     /* stop reading the client above this many framed bytes for TCP */
#define OUT_CAP (OUT_HIGH + 2 * (MAX_MSG + STACK_HDR + 8))
#define TCP_CHUNK (1 << 18)
#define IN_CAP (MAX_MSG + STACK_HDR + TCP_CHUNK)
#define STACK_HDR 48           /* the RDS header's size (stack mode) */

static char outbuf[OUT_CAP];
static size_t out_off, out_len;
static char inbuf[IN_CAP];
static size_t in_off, in_len;
/* stack mode: frame header size (4 otherwise), the readiness pair's relay end (-1 otherwise), sequences */
static size_t hdr_len = 4;
static int ready_b = -1;
static uint64_t tx_seq, rx_seq;

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
    if (ready_b >= 0 && out_off < out_len) {
        int unsent; /* the stack's ack check: what TCP still holds of what it took */
        if (ioctl(tcp, SIOCOUTQ, &unsent) < 0)
            return -1;
    }
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
    while (in_len - in_off >= hdr_len) {
        uint32_t n;
        memcpy(&n, inbuf + in_off, 4);
        n = ntohl(n);
        if (n > MAX_MSG)
            return -1;
        if (in_len - in_off < hdr_len + (size_t)n)
            break;
        if (ready_b >= 0) {
            uint64_t seq;
            memcpy(&seq, inbuf + in_off + 4, 8);
            if (seq != rx_seq)
                exit(3);
        }
        if (send(client, inbuf + in_off + hdr_len, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            return errno == EAGAIN || errno == EINTR ? 1 : -1;
        in_off += hdr_len + (size_t)n;
        if (ready_b >= 0) {
            rx_seq++;
            if (send(ready_b, "r", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN && errno != EINTR)
                return -1;
        }
    }
    if (in_off) { /* keep the partial frame at the start */
        memmove(inbuf, inbuf + in_off, in_len - in_off);
        in_len -= in_off;
        in_off = 0;
    }
    return 0;
}

/* stack mode: a loopback TCP pair; A goes to the client (SCM_RIGHTS), B is kept for the bytes */
static void hand_over_readiness(int client) {
    int lst = socket(AF_INET, SOCK_STREAM, 0), a = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof lo;
    if (lst < 0 || a < 0 || bind(lst, (struct sockaddr *)&lo, sizeof lo) < 0 || listen(lst, 1) < 0 ||
        getsockname(lst, (struct sockaddr *)&lo, &len) < 0 || connect(a, (struct sockaddr *)&lo, len) < 0)
        die("readiness pair");
    ready_b = accept(lst, NULL, NULL);
    if (ready_b < 0 || setsockopt(ready_b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        die("readiness accept");
    close(lst);
    char byte = 'a';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &a, sizeof a);
    if (sendmsg(client, &mh, MSG_NOSIGNAL) != 1)
        die("hand over the readiness fd");
    close(a);
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6 || (argc == 6 && strcmp(argv[5], "stack") != 0)) {
        fprintf(stderr, "usage: %s TAG listen|connect PEER [PORT [stack]]\n", argv[0]);
        return 2;
    }
    int stack = argc == 6;
    if (stack)
        hdr_len = STACK_HDR;
    int port = argc >= 5 ? atoi(argv[4]) : 17000;
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
    if (stack)
        hand_over_readiness(client);

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
                        ssize_t got = recv(client, outbuf + out_len + hdr_len, MAX_MSG + 1, MSG_DONTWAIT);
                        if (got < 0) {
                            if (errno == EAGAIN || errno == EINTR)
                                break;
                            return 0;
                        }
                        if (got == 0 && (e & (EPOLLHUP | EPOLLERR)))
                            return 0; /* the client went away (a 0-byte message has no HUP) */
                        uint32_t be = htonl((uint32_t)got);
                        memcpy(outbuf + out_len, &be, 4);
                        if (stack) {
                            memcpy(outbuf + out_len + 4, &tx_seq, 8);
                            memset(outbuf + out_len + 12, 0, STACK_HDR - 12);
                            tx_seq++;
                        }
                        out_len += hdr_len + (size_t)got;
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
