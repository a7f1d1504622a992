/* sse_fixture.py in C (benchmark fixture): the same HTTP interface, the same chunks, the same
 * step engine, at a fraction of the CPU per chunk, so that on a small host the fixture leaves
 * most of its core to the client under test.
 *
 * Not part of servelab. Every --step-us it writes one SSE chunk to every open stream (each chunk
 * carries its send time, "sent_ns", CLOCK_REALTIME in ns), and it keeps each request's receive
 * time and send times (by X-Request-Id), served as JSON at GET /sends (which then forgets
 * them); GET /health answers {}. One thread, epoll, non-blocking sockets, a timerfd for the
 * steps (absolute deadlines on CLOCK_MONOTONIC; a step that is late by more than one step does
 * not try to catch up, as in sse_fixture.py).
 *
 * Build and run (bench scripts do both through _common.start_fixture(..., impl="c")):
 *   cc -O2 -o sse_fixture_c sse_fixture.c && ./sse_fixture_c --port P --step-us 10000 --cpu 1
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static void buf_add(Buf *b, const char *s, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) { perror("realloc"); exit(1); }
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void buf_drop(Buf *b, size_t n) {
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

/* One request's truth: kept in the /sends list until it is served, and by its stream until
 * the stream ends; freed when neither holds it. */
typedef struct Record {
    char *rid;
    int64_t recv_ns;
    int64_t *sends;
    size_t n, cap;
    int listed, streaming;
} Record;

typedef struct Conn Conn;

typedef struct {
    Conn *conn;
    Record *rec;
    long left, total;
} Stream;

struct Conn {
    int fd;
    Buf in, out;
    int want_out; /* EPOLLOUT registered */
};

static int ep, tfd;
static Stream *streams;
static size_t n_streams, cap_streams;
static Record **records;
static size_t n_records, cap_records;
static long anon;

static int64_t now_ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void record_release(Record *r) {
    if (!r->listed && !r->streaming) {
        free(r->rid);
        free(r->sends);
        free(r);
    }
}

static void conn_close(Conn *c) {
    /* its streams end here; their records stay for /sends */
    size_t j = 0;
    for (size_t i = 0; i < n_streams; i++) {
        if (streams[i].conn == c) {
            streams[i].rec->streaming = 0;
            record_release(streams[i].rec);
        } else {
            streams[j++] = streams[i];
        }
    }
    n_streams = j;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->in.p);
    free(c->out.p);
    free(c);
}

/* Write now if nothing is queued, queue the rest; returns -1 when the peer is gone. */
static int conn_write(Conn *c, const char *s, size_t n) {
    if (c->out.len == 0) {
        ssize_t k = send(c->fd, s, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
            k = 0;
        }
        s += k;
        n -= (size_t)k;
    }
    if (n) {
        buf_add(&c->out, s, n);
        if (!c->want_out) {
            struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
            epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
            c->want_out = 1;
        }
    }
    return 0;
}

static int conn_flush(Conn *c) {
    while (c->out.len) {
        ssize_t k = send(c->fd, c->out.p, c->out.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return -1;
        }
        buf_drop(&c->out, (size_t)k);
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = 0;
    return 0;
}

static const char HEAD[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";

static void json_str(Buf *b, const char *s) {
    buf_add(b, "\"", 1);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') buf_add(b, "\\", 1);
        if ((unsigned char)*s >= 0x20) buf_add(b, s, 1);
    }
    buf_add(b, "\"", 1);
}

static void serve_sends(Conn *c) {
    Buf b = {0};
    char num[64];
    buf_add(&b, "{", 1);
    for (size_t i = 0; i < n_records; i++) {
        Record *r = records[i];
        if (i) buf_add(&b, ",", 1);
        json_str(&b, r->rid);
        int k = snprintf(num, sizeof num, ":{\"recv_ns\":%lld,\"sends\":[", (long long)r->recv_ns);
        buf_add(&b, num, (size_t)k);
        for (size_t j = 0; j < r->n; j++) {
            k = snprintf(num, sizeof num, j ? ",%lld" : "%lld", (long long)r->sends[j]);
            buf_add(&b, num, (size_t)k);
        }
        buf_add(&b, "]}", 2);
        r->listed = 0;
        record_release(r);
    }
    buf_add(&b, "}", 1);
    n_records = 0;
    char head[160];
    int k = snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     b.len);
    conn_write(c, head, (size_t)k);
    conn_write(c, b.p, b.len);
    free(b.p);
}

/* The value of header `name` (lower case, with the colon) in head[0:n], or NULL. */
static const char *header(const char *head, size_t n, const char *name, size_t *vlen) {
    size_t nl = strlen(name);
    for (const char *p = head; p && p < head + n;) {
        const char *eol = memmem(p, (size_t)(head + n - p), "\r\n", 2);
        const char *end = eol ? eol : head + n;
        if ((size_t)(end - p) > nl && strncasecmp(p, name, nl) == 0) {
            const char *v = p + nl;
            while (v < end && (*v == ' ' || *v == '\t')) v++;
            const char *e = end;
            while (e > v && (e[-1] == ' ' || e[-1] == '\t')) e--;
            *vlen = (size_t)(e - v);
            return v;
        }
        p = eol ? eol + 2 : NULL;
    }
    return NULL;
}

static int engine_idle = 1;
static int step_now; /* a stream arrived while idle: step once this batch of events is done */

static void handle(Conn *c, const char *head, size_t head_len, const char *body, size_t body_len) {
    int64_t recv = now_ns(CLOCK_REALTIME);
    if (head_len >= 22 && strncmp(head, "POST /v1/completions ", 21) == 0) {
        long total = 16;
        const char *m = memmem(body, body_len, "\"max_tokens\"", 12);
        if (m) {
            const char *v = m + 12, *end = body + body_len;
            while (v < end && (*v == ' ' || *v == ':')) v++;
            if (v < end && *v >= '0' && *v <= '9') total = strtol(v, NULL, 10);
        }
        if (total < 1) total = 1;
        size_t vl = 0;
        const char *v = header(head, head_len, "x-request-id:", &vl);
        Record *r = calloc(1, sizeof *r);
        if (v) {
            r->rid = strndup(v, vl);
        } else {
            r->rid = malloc(32);
            snprintf(r->rid, 32, "anon-%ld", anon++);
        }
        r->recv_ns = recv;
        r->listed = r->streaming = 1;
        r->cap = (size_t)total;
        r->sends = malloc(sizeof(int64_t) * r->cap);
        if (n_records == cap_records) {
            cap_records = cap_records ? cap_records * 2 : 1024;
            records = realloc(records, sizeof *records * cap_records);
        }
        records[n_records++] = r;
        conn_write(c, HEAD, sizeof HEAD - 1);
        if (n_streams == cap_streams) {
            cap_streams = cap_streams ? cap_streams * 2 : 1024;
            streams = realloc(streams, sizeof *streams * cap_streams);
        }
        streams[n_streams++] = (Stream){.conn = c, .rec = r, .left = total, .total = total};
        if (engine_idle) step_now = 1;
        return;
    }
    if (strncmp(head, "GET /sends ", 11) == 0) {
        serve_sends(c);
        return;
    }
    if (strncmp(head, "GET /health ", 12) == 0) {
        static const char ok[] =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        conn_write(c, ok, sizeof ok - 1);
        return;
    }
    static const char nf[] = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
    conn_write(c, nf, sizeof nf - 1);
}

/* Parse every complete request in c->in; -1 when the connection must close. */
static int conn_read(Conn *c) {
    char tmp[65536];
    for (;;) {
        ssize_t k = recv(c->fd, tmp, sizeof tmp, MSG_DONTWAIT);
        if (k == 0) return -1;
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return -1;
        }
        buf_add(&c->in, tmp, (size_t)k);
        if ((size_t)k < sizeof tmp) break;
    }
    for (;;) {
        char *end = c->in.len ? memmem(c->in.p, c->in.len, "\r\n\r\n", 4) : NULL;
        if (!end) return 0;
        size_t head_len = (size_t)(end - c->in.p);
        size_t vl = 0;
        const char *v = header(c->in.p, head_len, "content-length:", &vl);
        size_t n = v ? (size_t)strtoul(v, NULL, 10) : 0;
        if (c->in.len < head_len + 4 + n) return 0;
        handle(c, c->in.p, head_len, c->in.p + head_len + 4, n);
        buf_drop(&c->in, head_len + 4 + n);
    }
}

static const char PREFIX_A[] = "data: {\"id\":\"cmpl-";
static const char PREFIX_B[] =
    "\",\"object\":\"text_completion\",\"created\":0,\"model\":\"fixture\",\"choices\":[{\"index\":0,"
    "\"text\":\" tok\",\"logprobs\":null,\"finish_reason\":";

static long chunk_tokens = 1; /* tokens (SSE events) per write to a stream per step */

static void step(void) {
    char body[16384], frame[16640];
    size_t j = 0;
    for (size_t i = 0; i < n_streams; i++) {
        Stream *s = &streams[i];
        int64_t now = now_ns(CLOCK_REALTIME);
        Record *r = s->rec;
        int n = 0;
        int last = 0;
        for (long k = 0; k < chunk_tokens && !last; k++) {
            s->left--;
            last = s->left == 0;
            n += snprintf(body + n, sizeof body - (size_t)n,
                          "%s%.200s%s%s,\"stop_reason\":null}],\"usage\":null,\"sent_ns\":%lld}\n\n",
                          PREFIX_A, r->rid, PREFIX_B, last ? "\"length\"" : "null",
                          (long long)now);
            if (r->n == r->cap) {
                r->cap *= 2;
                r->sends = realloc(r->sends, sizeof(int64_t) * r->cap);
            }
            r->sends[r->n++] = now;
        }
        if (last) {
            n += snprintf(body + n, sizeof body - (size_t)n,
                          "data: {\"id\":\"cmpl-x\",\"object\":\"text_completion\",\"created\":0,"
                          "\"model\":\"fixture\",\"choices\":[],\"usage\":{\"prompt_tokens\":16,"
                          "\"total_tokens\":%ld,\"completion_tokens\":%ld}}\n\ndata: [DONE]\n\n",
                          16 + s->total, s->total);
        }
        int f = snprintf(frame, sizeof frame, "%x\r\n%s\r\n%s", n, body, last ? "0\r\n\r\n" : "");
        int gone = conn_write(s->conn, frame, (size_t)f) < 0;
        if (last || gone) {
            r->streaming = 0;
            record_release(r);
        } else {
            streams[j++] = *s;
        }
    }
    n_streams = j;
}

static void arm(int64_t deadline_mono) {
    struct itimerspec it = {0};
    if (deadline_mono > 0) {
        it.it_value.tv_sec = deadline_mono / 1000000000;
        it.it_value.tv_nsec = deadline_mono % 1000000000;
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &it, NULL);
}

int main(int argc, char **argv) {
    int port = 0, cpu = -1;
    long step_us = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--step-us")) step_us = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--cpu")) cpu = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--chunk-tokens")) chunk_tokens = atol(argv[i + 1]);
        else { fprintf(stderr, "sse_fixture_c: unknown option %s\n", argv[i]); return 2; }
    }
    if (chunk_tokens < 1 || chunk_tokens > 32) {
        fprintf(stderr, "sse_fixture_c: --chunk-tokens must be 1 to 32\n");
        return 2;
    }
    if (port <= 0) { fprintf(stderr, "usage: %s --port P [--step-us N] [--cpu C]\n", argv[0]); return 2; }
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 1024) < 0) {
        perror("sse_fixture_c: listen");
        return 1;
    }
    ep = epoll_create1(0);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &lfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    ev = (struct epoll_event){.events = EPOLLIN, .data.ptr = &tfd};
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);
    const int64_t step_ns = step_us * 1000;
    int64_t deadline = 0;
    struct epoll_event evs[512];
    for (;;) {
        int spin = !engine_idle && step_ns == 0;
        int n = epoll_wait(ep, evs, 512, spin ? 0 : -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            return 1;
        }
        int timer = 0;
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &lfd) {
                for (;;) {
                    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0) break;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    Conn *c = calloc(1, sizeof *c);
                    c->fd = fd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
            } else if (p == &tfd) {
                uint64_t exp;
                while (read(tfd, &exp, sizeof exp) > 0) {}
                timer = 1;
            } else {
                Conn *c = p;
                int bad = 0;
                if (evs[i].events & (EPOLLERR | EPOLLHUP)) bad = 1;
                if (!bad && (evs[i].events & EPOLLOUT)) bad = conn_flush(c) < 0;
                if (!bad && (evs[i].events & EPOLLIN)) bad = conn_read(c) < 0;
                if (bad) conn_close(c);
            }
        }
        int64_t t = now_ns(CLOCK_MONOTONIC);
        if (step_now) {
            /* the first step comes right after the requests that woke the engine */
            step_now = 0;
            engine_idle = 0;
            deadline = t;
            timer = 1;
        } else if (spin) {
            timer = 1;
        }
        if (!timer || engine_idle) continue;
        if (deadline < t - step_ns) deadline = t - step_ns;
        step();
        deadline += step_ns;
        if (n_streams == 0) {
            engine_idle = 1;
            arm(0);
        } else if (step_ns > 0) {
            arm(deadline);
        }
    }
}
