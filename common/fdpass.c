#include "common/fdpass.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Control buffer for the most descriptors a message may carry; a sender that attaches more
 * gets MSG_CTRUNC on our side (the kernel drops what does not fit, so nothing leaks). */
typedef union fdpass_cbuf {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX_FDS)];
} fdpass_cbuf;

static long long fdpass_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until sock is ready for events or the deadline (ms, CLOCK_MONOTONIC; -1 = none)
 * passes. */
static td_err fdpass_wait(int sock, short events, long long deadline, const char *what)
{
    for (;;) {
        int timeout = -1;
        if (deadline >= 0) {
            long long left = deadline - fdpass_now_ms();
            if (left <= 0)
                return err_set(TD_ETIMEOUT, "%s: timed out", what);
            timeout = left > 1000000 ? 1000000 : (int)left;
        }
        struct pollfd p = {.fd = sock, .events = events};
        int r = poll(&p, 1, timeout);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return err_set(TD_EIO, "%s: poll: %s", what, strerror(errno));
        if (r == 0)
            continue; /* the deadline check above decides */
        if (p.revents & POLLNVAL)
            return err_set(TD_EINVAL, "%s: not an open socket", what);
        /* POLLHUP/POLLERR: let the following call report what happened. */
        return TD_OK;
    }
}

static long long fdpass_deadline(int timeout_ms)
{
    return timeout_ms < 0 ? -1 : fdpass_now_ms() + timeout_ms;
}

static void fdpass_close_all(const int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

td_err fdpass_socketpair(int socks[2])
{
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, socks) != 0)
        return err_set(TD_EIO, "socketpair: %s", strerror(errno));
    return TD_OK;
}

td_err fdpass_send(int sock, const void *payload, size_t len, const int *fds, size_t n_fds,
                   int timeout_ms)
{
    /* An empty SEQPACKET message reads like end-of-stream on the other side. */
    TD_ASSERT(payload && len >= 1 && len <= FDPASS_MAX_PAYLOAD);
    TD_ASSERT(n_fds <= FDPASS_MAX_FDS && (n_fds == 0 || fds));
    struct iovec iov = {.iov_base = (void *)payload, .iov_len = len};
    fdpass_cbuf cbuf;
    memset(&cbuf, 0, sizeof cbuf);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n_fds > 0) {
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
    }
    long long deadline = fdpass_deadline(timeout_ms);
    for (;;) {
        ssize_t r = sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r >= 0) {
            TD_ASSERT((size_t)r == len); /* SEQPACKET sends whole messages */
            return TD_OK;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            TD_TRY(fdpass_wait(sock, POLLOUT, deadline, "fdpass send"));
            continue;
        }
        if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
            return err_set(TD_ECLOSED, "fdpass send: peer closed the socket");
        if (errno == EBADF)
            return err_set(TD_EINVAL, "fdpass send: bad socket or descriptor");
        return err_set(TD_EIO, "fdpass send: %s", strerror(errno));
    }
}

/* Collects the SCM_RIGHTS descriptors of a received message into got. Our control buffer
 * holds at most FDPASS_MAX_FDS; should alignment slack let one more in, it is closed and
 * *extra set, so nothing the peer sent stays open unaccounted. */
static size_t fdpass_collect(struct msghdr *msg, int *got, int *extra)
{
    size_t n = 0;
    *extra = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (n < FDPASS_MAX_FDS) {
                got[n++] = fd;
            } else {
                close(fd);
                *extra = 1;
            }
        }
    }
    return n;
}

td_err fdpass_recv(int sock, void *payload, size_t cap, size_t *len, int *fds, size_t max_fds,
                   size_t *n_fds, int timeout_ms)
{
    TD_ASSERT(payload && cap >= 1 && len && n_fds && (max_fds == 0 || fds));
    *len = 0;
    *n_fds = 0;
    long long deadline = fdpass_deadline(timeout_ms);
    for (;;) {
        struct iovec iov = {.iov_base = payload, .iov_len = cap};
        fdpass_cbuf cbuf;
        memset(&cbuf, 0, sizeof cbuf);
        struct msghdr msg = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
            .msg_controllen = sizeof cbuf.buf};
        ssize_t r = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                TD_TRY(fdpass_wait(sock, POLLIN, deadline, "fdpass receive"));
                continue;
            }
            if (errno == ECONNRESET || errno == ENOTCONN)
                return err_set(TD_ECLOSED, "fdpass receive: peer closed the socket");
            if (errno == EBADF || errno == ENOTSOCK)
                return err_set(TD_EINVAL, "fdpass receive: not an open socket");
            return err_set(TD_EIO, "fdpass receive: %s", strerror(errno));
        }
        int got[FDPASS_MAX_FDS];
        int extra;
        size_t n = fdpass_collect(&msg, got, &extra);
        if ((msg.msg_flags & MSG_CTRUNC) || extra) {
            fdpass_close_all(got, n);
            return err_set(TD_EPROTO, "fdpass receive: control message truncated (peer sent "
                           "more than %d descriptors); closed the %zu received",
                           FDPASS_MAX_FDS, n);
        }
        if (msg.msg_flags & MSG_TRUNC) {
            fdpass_close_all(got, n);
            return err_set(TD_EPROTO, "fdpass receive: message larger than %zu bytes; closed "
                           "its %zu descriptors", cap, n);
        }
        if (r == 0) {
            fdpass_close_all(got, n);
            if (n == 0)
                return err_set(TD_ECLOSED, "fdpass receive: peer closed the socket");
            return err_set(TD_EPROTO, "fdpass receive: empty message with %zu descriptors", n);
        }
        if (n > max_fds) {
            fdpass_close_all(got, n);
            return err_set(TD_EPROTO, "fdpass receive: %zu descriptors where at most %zu were "
                           "expected; closed them", n, max_fds);
        }
        if (n > 0)
            memcpy(fds, got, n * sizeof(int));
        *len = (size_t)r;
        *n_fds = n;
        return TD_OK;
    }
}

static int fdpass_name_ok(const char *name)
{
    if (!name[0] || name[0] == '.')
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return 0;
    return 1;
}

td_err fdpass_path(const char *dir, const char *name, char *out, size_t cap)
{
    TD_ASSERT(dir && name && out && cap > 0);
    out[0] = '\0';
    if (!fdpass_name_ok(name))
        return err_set(TD_EINVAL, "socket name \"%s\": use letters, digits, '-', '_', '.'",
                       name);
    struct stat st;
    /* lstat: a symlink could point the socket somewhere another user controls. */
    if (lstat(dir, &st) != 0)
        return err_set(errno == ENOENT ? TD_ENOENT : TD_EIO, "socket directory %s: %s", dir,
                       strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return err_set(TD_EINVAL, "socket directory %s is not a directory", dir);
    if (st.st_uid != geteuid())
        return err_set(TD_EINVAL, "socket directory %s is owned by uid %u, not by this user "
                       "(uid %u)", dir, (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & 077)
        return err_set(TD_EINVAL, "socket directory %s has mode %03o; it must be private "
                       "(0700)", dir, (unsigned)(st.st_mode & 0777));
    struct sockaddr_un sa;
    int n = snprintf(out, cap, "%s/%s.sock", dir, name);
    if (n < 0 || (size_t)n >= cap || (size_t)n >= sizeof sa.sun_path) {
        out[0] = '\0';
        return err_set(TD_ERANGE, "socket path %s/%s.sock is longer than %zu bytes", dir, name,
                       sizeof sa.sun_path - 1);
    }
    return TD_OK;
}

static td_err fdpass_addr(const char *path, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa->sun_path)
        return err_set(TD_ERANGE, "socket path %s is longer than %zu bytes", path,
                       sizeof sa->sun_path - 1);
    memcpy(sa->sun_path, path, strlen(path));
    return TD_OK;
}

td_err fdpass_connect(const char *path, int *sock)
{
    *sock = -1;
    struct sockaddr_un sa;
    TD_TRY(fdpass_addr(path, &sa));
    /* Non-blocking connect: a full backlog answers EAGAIN instead of blocking forever. */
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return err_set(TD_EIO, "socket: %s", strerror(errno));
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(s);
        if (e == ENOENT || e == ECONNREFUSED)
            return err_set(TD_ENOENT, "connect %s: nobody listens there (%s)", path,
                           strerror(e));
        if (e == EAGAIN)
            return err_set(TD_EBUSY, "connect %s: listener's backlog is full", path);
        return err_set(TD_EIO, "connect %s: %s", path, strerror(e));
    }
    int fl = fcntl(s, F_GETFL);
    if (fl < 0 || fcntl(s, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(s);
        return err_set(TD_EIO, "fcntl %s: %s", path, strerror(e));
    }
    *sock = s;
    return TD_OK;
}

td_err fdpass_listen(const char *path, int *sock)
{
    *sock = -1;
    struct sockaddr_un sa;
    TD_TRY(fdpass_addr(path, &sa));
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return err_set(TD_EINVAL, "listen %s: exists and is not a socket", path);
        /* Replace a socket left by a dead process, never one that is still served. */
        int probe;
        if (fdpass_connect(path, &probe) == TD_OK) {
            close(probe);
            return err_set(TD_EBUSY, "listen %s: another process is listening there", path);
        }
        if (unlink(path) != 0 && errno != ENOENT)
            return err_set(TD_EIO, "listen %s: cannot remove stale socket: %s", path,
                           strerror(errno));
    }
    /* Non-blocking, so fdpass_accept's timeout holds even if another thread takes the
     * connection between poll and accept. */
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return err_set(TD_EIO, "socket: %s", strerror(errno));
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, 16) != 0) {
        int e = errno;
        close(s);
        return err_set(TD_EIO, "listen %s: %s", path, strerror(e));
    }
    *sock = s;
    return TD_OK;
}

td_err fdpass_accept(int listen_sock, int timeout_ms, int *sock)
{
    *sock = -1;
    long long deadline = fdpass_deadline(timeout_ms);
    for (;;) {
        int s = accept4(listen_sock, NULL, NULL, SOCK_CLOEXEC);
        if (s < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                TD_TRY(fdpass_wait(listen_sock, POLLIN, deadline, "fdpass accept"));
                continue;
            }
            return err_set(TD_EIO, "accept: %s", strerror(errno));
        }
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
            int e = errno;
            close(s);
            return err_set(TD_EIO, "accept: SO_PEERCRED: %s", strerror(e));
        }
        if (cred.uid != geteuid()) {
            close(s);
            return err_set(TD_EPROTO, "accept: refused a peer running as uid %u (pid %d)",
                           (unsigned)cred.uid, (int)cred.pid);
        }
        *sock = s;
        return TD_OK;
    }
}
