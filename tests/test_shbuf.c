/* Shared buffers of the cpu kind between real processes, and fdpass, which carries their fds.
 * The test binary starts itself again as the peer process (tests/support/spawn.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/fdpass.h"
#include "common/shbuf.h"
#include "tests/support/shbuf_wire.h"
#include "tests/support/spawn.h"

#define TIMEOUT_MS 10000
/* Not a multiple of the page size: the exact size must survive export and import. */
#define BUF_SIZE ((size_t)(1 << 20) + 13)

/* ---- byte patterns: every byte of a buffer is checked, not a sample ---- */

static void pattern_fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = sw_pattern_byte(i, seed);
}

/* -1 when every byte matches, else the first index that does not. */
static long pattern_find_mismatch(const uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != sw_pattern_byte(i, seed))
            return (long)i;
    return -1;
}

/* ---- child modes ---- */

/* Imports the parent's buffer, checks pattern 1, writes pattern 2, later checks pattern 3. */
static int child_cpu_peer(int sock)
{
    sw_msg w;
    int fd;
    if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK || fd < 0)
        return sw_child_fail(sock, "receiving the buffer", TIMEOUT_MS);
    shbuf *sb;
    td_err e = shbuf_import(&sb, &w.desc, fd);
    close(fd);
    if (e != TD_OK)
        return sw_child_fail(sock, "import", TIMEOUT_MS);
    uint8_t *p = shbuf_host(sb);
    size_t n = shbuf_size(sb);
    long bad = pattern_find_mismatch(p, n, 1);
    if (n != BUF_SIZE || bad >= 0) {
        err_set(TD_EINVAL, "size %zu, first wrong byte at %ld", n, bad);
        return sw_child_fail(sock, "pattern 1", TIMEOUT_MS);
    }
    pattern_fill(p, n, 2);
    sw_send(sock, "ok", NULL, NULL, -1, TIMEOUT_MS);
    if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK || strcmp(w.text, "check 3") != 0)
        return sw_child_fail(sock, "waiting for check 3", TIMEOUT_MS);
    bad = pattern_find_mismatch(p, n, 3);
    if (bad >= 0) {
        err_set(TD_EINVAL, "first wrong byte at %ld", bad);
        return sw_child_fail(sock, "pattern 3", TIMEOUT_MS);
    }
    sw_send(sock, "ok", NULL, NULL, -1, TIMEOUT_MS);
    shbuf_release(sb);
    return 0;
}

/* Creates a buffer, hands it to the parent, writes pattern 5 once the parent has mapped it,
 * then releases everything and exits. */
static int child_cpu_exporter(int sock)
{
    shbuf *sb;
    if (shbuf_create(&sb, SHBUF_KIND_CPU, "test.orphan", BUF_SIZE, NULL) != TD_OK)
        return sw_child_fail(sock, "create", TIMEOUT_MS);
    pattern_fill(shbuf_host(sb), BUF_SIZE, 4);
    shbuf_desc desc;
    int fd;
    if (shbuf_export(sb, &desc, &fd) != TD_OK)
        return sw_child_fail(sock, "export", TIMEOUT_MS);
    if (sw_send(sock, "buffer", &desc, NULL, fd, TIMEOUT_MS) != TD_OK)
        return sw_child_fail(sock, "send", TIMEOUT_MS);
    close(fd);
    sw_msg w;
    if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK || strcmp(w.text, "imported") != 0)
        return sw_child_fail(sock, "waiting for the import", TIMEOUT_MS);
    pattern_fill(shbuf_host(sb), BUF_SIZE, 5);
    shbuf_release(sb);
    sw_send(sock, "ok", NULL, NULL, -1, TIMEOUT_MS);
    return 0;
}

static int child_main(const char *mode, int sock)
{
    int rc = 2;
    if (strcmp(mode, "cpu-peer") == 0)
        rc = child_cpu_peer(sock);
    else if (strcmp(mode, "cpu-exporter") == 0)
        rc = child_cpu_exporter(sock);
    else
        fprintf(stderr, "unknown child mode %s\n", mode);
    close(sock);
    return rc;
}

/* ---- cpu shared buffers ---- */

static void test_cpu_writes_are_visible_in_both_processes(void **state)
{
    (void)state;
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CPU, "test.both", BUF_SIZE, NULL), TD_OK);
    uint8_t *p = shbuf_host(sb);
    assert_non_null(p);
    assert_int_equal(shbuf_devptr(sb), 0);
    assert_int_equal(p[0], 0); /* created zero-filled */
    assert_int_equal(p[BUF_SIZE - 1], 0);
    pattern_fill(p, BUF_SIZE, 1);

    int sock;
    pid_t pid;
    assert_int_equal(spawn_self("cpu-peer", &sock, &pid), 0);
    shbuf_desc desc;
    int fd;
    assert_int_equal(shbuf_export(sb, &desc, &fd), TD_OK);
    assert_int_equal(sw_send(sock, "buffer", &desc, NULL, fd, TIMEOUT_MS), TD_OK);
    close(fd);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK); /* the child saw pattern 1 and wrote pattern 2 */
    assert_int_equal(pattern_find_mismatch(p, BUF_SIZE, 2), -1);
    pattern_fill(p, BUF_SIZE, 3);
    assert_int_equal(sw_send(sock, "check 3", NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK);
    assert_int_equal(spawn_wait(pid, TIMEOUT_MS), 0);
    close(sock);
    shbuf_release(sb);
}

static void test_cpu_import_outlives_exporter_process(void **state)
{
    (void)state;
    int sock;
    pid_t pid;
    assert_int_equal(spawn_self("cpu-exporter", &sock, &pid), 0);
    sw_msg w;
    int fd;
    assert_int_equal(sw_recv(sock, &w, &fd, TIMEOUT_MS), TD_OK);
    assert_string_equal(w.text, "buffer");
    assert_true(fd >= 0);
    assert_string_equal(w.desc.name, "test.orphan");
    assert_int_equal(w.desc.kind, SHBUF_KIND_CPU);
    assert_int_equal(w.desc.size, BUF_SIZE);
    shbuf *sb;
    assert_int_equal(shbuf_import(&sb, &w.desc, fd), TD_OK);
    uint8_t *p = shbuf_host(sb);
    assert_int_equal(pattern_find_mismatch(p, BUF_SIZE, 4), -1);
    assert_int_equal(sw_send(sock, "imported", NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK);
    /* The exporter has released its buffer and exited: reap it before touching memory. */
    assert_int_equal(spawn_wait(pid, TIMEOUT_MS), 0);
    close(sock);
    assert_int_equal(pattern_find_mismatch(p, BUF_SIZE, 5), -1);
    pattern_fill(p, BUF_SIZE, 6);
    assert_int_equal(pattern_find_mismatch(p, BUF_SIZE, 6), -1);
    /* The fd alone still holds the memory: a second mapping sees the first one's writes. */
    shbuf *again;
    assert_int_equal(shbuf_import(&again, &w.desc, fd), TD_OK);
    close(fd);
    assert_ptr_not_equal(shbuf_host(again), p);
    assert_int_equal(pattern_find_mismatch(shbuf_host(again), BUF_SIZE, 6), -1);
    shbuf_release(again);
    shbuf_release(sb);
}

static void test_cpu_import_larger_than_memfd_is_refused(void **state)
{
    (void)state;
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CPU, "test.size", 4097, NULL), TD_OK);
    shbuf_desc desc;
    int fd;
    assert_int_equal(shbuf_export(sb, &desc, &fd), TD_OK);
    int before = spawn_fd_count();
    shbuf_desc big = desc;
    big.size = 4098;
    shbuf *imp = (shbuf *)&imp;
    assert_int_equal(shbuf_import(&imp, &big, fd), TD_EINVAL);
    assert_null(imp);
    assert_non_null(strstr(err_msg(), "memfd holds 4097 bytes, descriptor says 4098"));
    big.size = (uint64_t)1 << 40; /* more than anything mappable */
    assert_int_equal(shbuf_import(&imp, &big, fd), TD_EINVAL);
    shbuf_desc small = desc;
    small.size = 4096; /* a stale or mixed-up descriptor: refused too */
    assert_int_equal(shbuf_import(&imp, &small, fd), TD_EINVAL);
    assert_int_equal(spawn_fd_count(), before);
    assert_int_equal(shbuf_import(&imp, &desc, fd), TD_OK);
    assert_int_equal(shbuf_size(imp), 4097);
    shbuf_release(imp);
    close(fd);
    shbuf_release(sb);
}

static void test_cpu_import_refuses_fds_that_are_not_its_sealed_memfd(void **state)
{
    (void)state;
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CPU, "test.kind", 8192, NULL), TD_OK);
    shbuf_desc desc;
    int good;
    assert_int_equal(shbuf_export(sb, &desc, &good), TD_OK);
    int before = spawn_fd_count();
    shbuf *imp;

    /* A regular file of the right size. */
    int file = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    assert_true(file >= 0);
    assert_int_equal(ftruncate(file, 8192), 0);
    assert_int_equal(shbuf_import(&imp, &desc, file), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "not a memfd"));
    close(file);

    /* A pipe. */
    int pipefd[2];
    assert_int_equal(pipe2(pipefd, O_CLOEXEC), 0);
    assert_int_equal(shbuf_import(&imp, &desc, pipefd[0]), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "not a memfd"));
    close(pipefd[0]);
    close(pipefd[1]);

    /* A memfd with the right name and size but no seals: a peer could shrink it. */
    int open_fd = memfd_create("tandem:test.kind", MFD_CLOEXEC);
    assert_true(open_fd >= 0);
    assert_int_equal(ftruncate(open_fd, 8192), 0);
    assert_int_equal(shbuf_import(&imp, &desc, open_fd), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "not sealed"));
    close(open_fd);

    /* Another buffer's memfd. */
    shbuf *other;
    assert_int_equal(shbuf_create(&other, SHBUF_KIND_CPU, "test.other", 8192, NULL), TD_OK);
    shbuf_desc other_desc;
    int other_fd;
    assert_int_equal(shbuf_export(other, &other_desc, &other_fd), TD_OK);
    assert_int_equal(shbuf_import(&imp, &desc, other_fd), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "not this buffer's memfd"));
    close(other_fd);
    shbuf_release(other);

    /* A closed descriptor. */
    int closed = dup(good);
    close(closed);
    assert_int_equal(shbuf_import(&imp, &desc, closed), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "not open"));

    assert_int_equal(spawn_fd_count(), before);
    close(good);
    shbuf_release(sb);
}

static void test_cpu_descriptor_from_a_peer_is_validated(void **state)
{
    (void)state;
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CPU, "test.desc", 4096, NULL), TD_OK);
    shbuf_desc desc;
    int fd;
    assert_int_equal(shbuf_export(sb, &desc, &fd), TD_OK);
    shbuf *imp;
    shbuf_desc bad = desc;
    memset(bad.name, 'a', sizeof bad.name); /* no terminating NUL */
    assert_int_equal(shbuf_import(&imp, &bad, fd), TD_EFORMAT);
    bad = desc;
    bad.name[0] = '\0';
    assert_int_equal(shbuf_import(&imp, &bad, fd), TD_EFORMAT);
    bad = desc;
    strcpy(bad.name, "../etc");
    assert_int_equal(shbuf_import(&imp, &bad, fd), TD_EFORMAT);
    bad = desc;
    bad.kind = 7;
    assert_int_equal(shbuf_import(&imp, &bad, fd), TD_EFORMAT);
    assert_non_null(strstr(err_msg(), "unknown kind 7"));
    bad = desc;
    bad.size = 0;
    assert_int_equal(shbuf_import(&imp, &bad, fd), TD_EFORMAT);
    bad = desc;
    bad.size = UINT64_MAX;
    assert_int_equal(shbuf_import(&imp, &bad, fd), TD_EFORMAT);
    close(fd);
    shbuf_release(sb);
}

static void test_cpu_peer_cannot_resize_or_reseal_buffer(void **state)
{
    (void)state;
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CPU, "test.seal", 8192, NULL), TD_OK);
    shbuf_desc desc;
    int fd;
    assert_int_equal(shbuf_export(sb, &desc, &fd), TD_OK);
    assert_int_equal(ftruncate(fd, 4096), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(fd, 16384), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
    assert_int_equal(errno, EPERM);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, 8192);
    close(fd);
    shbuf_release(sb);
}

static void test_cpu_descriptor_fields_and_generations(void **state)
{
    (void)state;
    shbuf *a, *b;
    assert_int_equal(shbuf_create(&a, SHBUF_KIND_CPU, "kv:pages-0", 100, NULL), TD_OK);
    assert_int_equal(shbuf_create(&b, SHBUF_KIND_CPU, "kv:pages-0", 200, NULL), TD_OK);
    shbuf_desc da, db;
    int fa, fb;
    assert_int_equal(shbuf_export(a, &da, &fa), TD_OK);
    assert_int_equal(shbuf_export(b, &db, &fb), TD_OK);
    assert_string_equal(da.name, "kv:pages-0");
    assert_int_equal(da.kind, SHBUF_KIND_CPU);
    assert_int_equal(da.size, 100);
    assert_int_equal(db.size, 200);
    static const uint8_t zero[CUDRV_UUID_BYTES];
    assert_memory_equal(da.device_uuid, zero, CUDRV_UUID_BYTES);
    /* Re-creating a name gives a newer generation; generations are wall-clock ns. */
    assert_true(db.generation > da.generation);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    assert_true(da.generation > now - 60ull * 1000000000u && db.generation <= now + 1000000);
    /* Exported fds are new and close-on-exec. */
    assert_int_not_equal(fa, fb);
    assert_int_equal(fcntl(fa, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    close(fa);
    close(fb);
    shbuf_release(a);
    shbuf_release(b);
    shbuf *bad;
    assert_int_equal(shbuf_create(&bad, SHBUF_KIND_CPU, "has space", 10, NULL), TD_EINVAL);
    assert_int_equal(shbuf_create(&bad, SHBUF_KIND_CPU, "zero", 0, NULL), TD_EINVAL);
    shbuf_release(NULL);
}

static void test_cuda_kind_without_a_gpu_is_not_supported(void **state)
{
    (void)state;
    if (cudrv_available()) {
        skip(); /* test_gpu_shbuf covers this machine */
        return;
    }
    cudrv_device dev;
    td_err e = cudrv_device_open(&dev, "0");
    assert_true(e == TD_ENOTSUP || e == TD_ECUDA);
    assert_true(strlen(err_msg()) > 0);
    shbuf_desc desc;
    memset(&desc, 0, sizeof desc);
    strcpy(desc.name, "test.gpu");
    desc.kind = SHBUF_KIND_CUDA;
    desc.size = 4096;
    int fd = memfd_create("x", MFD_CLOEXEC);
    shbuf *sb;
    e = shbuf_import(&sb, &desc, fd);
    assert_true(e == TD_ENOTSUP || e == TD_ECUDA);
    assert_null(sb);
    close(fd);
    shbuf_event *ev;
    shbuf_event_desc edesc;
    memset(&edesc, 0, sizeof edesc);
    e = shbuf_event_import(&ev, &edesc);
    assert_true(e == TD_ENOTSUP || e == TD_ECUDA);
    assert_null(ev);
}

/* ---- fdpass ---- */

static int memfd_with(const char *text)
{
    int fd = memfd_create("fdpass-test", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    return fd;
}

static void assert_same_file(int a, int b)
{
    struct stat sa, sb;
    assert_int_equal(fstat(a, &sa), 0);
    assert_int_equal(fstat(b, &sb), 0);
    assert_int_equal(sa.st_ino, sb.st_ino);
    assert_int_equal(sa.st_dev, sb.st_dev);
}

static void test_fdpass_payload_and_fds_arrive_intact(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(fdpass_socketpair(sv), TD_OK);
    static const char *texts[3] = {"alpha", "beta", "gamma"};
    int fds[3];
    for (int i = 0; i < 3; i++)
        fds[i] = memfd_with(texts[i]);
    uint8_t payload[300];
    pattern_fill(payload, sizeof payload, 9);
    assert_int_equal(fdpass_send(sv[0], payload, sizeof payload, fds, 3, TIMEOUT_MS), TD_OK);

    uint8_t got[FDPASS_MAX_PAYLOAD];
    int rfds[FDPASS_MAX_FDS];
    size_t len, n;
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, rfds, FDPASS_MAX_FDS, &n,
                                 TIMEOUT_MS),
                     TD_OK);
    assert_int_equal(len, 300);
    assert_memory_equal(got, payload, 300);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_not_equal(rfds[i], fds[i]);
        assert_same_file(rfds[i], fds[i]);
        char buf[16] = {0};
        assert_int_equal(pread(rfds[i], buf, sizeof buf - 1, 0), (ssize_t)strlen(texts[i]));
        assert_string_equal(buf, texts[i]);
        assert_int_equal(fcntl(rfds[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
        close(rfds[i]);
    }

    /* The limits themselves: the largest payload with the most descriptors. */
    static uint8_t big[FDPASS_MAX_PAYLOAD];
    pattern_fill(big, sizeof big, 10);
    int many[FDPASS_MAX_FDS];
    for (int i = 0; i < FDPASS_MAX_FDS; i++)
        many[i] = fds[i % 3];
    assert_int_equal(fdpass_send(sv[0], big, sizeof big, many, FDPASS_MAX_FDS, TIMEOUT_MS),
                     TD_OK);
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, rfds, FDPASS_MAX_FDS, &n,
                                 TIMEOUT_MS),
                     TD_OK);
    assert_int_equal(len, FDPASS_MAX_PAYLOAD);
    assert_memory_equal(got, big, FDPASS_MAX_PAYLOAD);
    assert_int_equal(n, FDPASS_MAX_FDS);
    for (int i = 0; i < FDPASS_MAX_FDS; i++) {
        assert_same_file(rfds[i], fds[i % 3]);
        close(rfds[i]);
    }
    /* A message without descriptors. */
    assert_int_equal(fdpass_send(sv[0], "x", 1, NULL, 0, TIMEOUT_MS), TD_OK);
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, rfds, 1, &n, TIMEOUT_MS), TD_OK);
    assert_int_equal(len, 1);
    assert_int_equal(got[0], 'x');
    assert_int_equal(n, 0);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    close(sv[0]);
    close(sv[1]);
}

/* Sends n descriptors (copies of fd) with a raw sendmsg, past fdpass's own limit. */
static void raw_send_fds(int sock, int fd, size_t n, const void *payload, size_t len)
{
    int fds[64];
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++)
        fds[i] = fd;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * 64)];
    } cbuf;
    memset(&cbuf, 0, sizeof cbuf);
    struct iovec iov = {.iov_base = (void *)payload, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * n)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    assert_int_equal(sendmsg(sock, &msg, 0), (ssize_t)len);
}

static void test_fdpass_truncated_control_message_is_an_error_without_leaks(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(fdpass_socketpair(sv), TD_OK);
    int fd = memfd_with("x");
    int before = spawn_fd_count();
    raw_send_fds(sv[0], fd, FDPASS_MAX_FDS + 4, "hello", 5);
    char got[64];
    int rfds[FDPASS_MAX_FDS];
    size_t len = 99, n = 99;
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, rfds, FDPASS_MAX_FDS, &n,
                                 TIMEOUT_MS),
                     TD_EPROTO);
    assert_non_null(strstr(err_msg(), "control message truncated"));
    assert_int_equal(len, 0);
    assert_int_equal(n, 0);
    assert_int_equal(spawn_fd_count(), before);
    /* The socket still works afterwards. */
    assert_int_equal(fdpass_send(sv[0], "next", 4, &fd, 1, TIMEOUT_MS), TD_OK);
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, rfds, 1, &n, TIMEOUT_MS), TD_OK);
    assert_int_equal(len, 4);
    assert_memory_equal(got, "next", 4);
    assert_int_equal(n, 1);
    close(rfds[0]);
    close(fd);
    close(sv[0]);
    close(sv[1]);
}

static void test_fdpass_more_fds_than_expected_are_closed(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(fdpass_socketpair(sv), TD_OK);
    int fds[3] = {memfd_with("a"), memfd_with("b"), memfd_with("c")};
    int before = spawn_fd_count();
    assert_int_equal(fdpass_send(sv[0], "three", 5, fds, 3, TIMEOUT_MS), TD_OK);
    char got[64];
    int rfds[2];
    size_t len, n;
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, rfds, 2, &n, TIMEOUT_MS),
                     TD_EPROTO);
    assert_non_null(strstr(err_msg(), "3 descriptors where at most 2"));
    assert_int_equal(n, 0);
    assert_int_equal(spawn_fd_count(), before);
    /* A peer that attaches descriptors where none are expected. */
    assert_int_equal(fdpass_send(sv[0], "one", 3, fds, 1, TIMEOUT_MS), TD_OK);
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, NULL, 0, &n, TIMEOUT_MS),
                     TD_EPROTO);
    assert_int_equal(spawn_fd_count(), before);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    close(sv[0]);
    close(sv[1]);
}

static void test_fdpass_oversized_payload_is_an_error_without_leaks(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(fdpass_socketpair(sv), TD_OK);
    int fds[2] = {memfd_with("a"), memfd_with("b")};
    int before = spawn_fd_count();
    uint8_t payload[200];
    pattern_fill(payload, sizeof payload, 11);
    assert_int_equal(fdpass_send(sv[0], payload, sizeof payload, fds, 2, TIMEOUT_MS), TD_OK);
    uint8_t got[100];
    int rfds[4];
    size_t len, n;
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, rfds, 4, &n, TIMEOUT_MS),
                     TD_EPROTO);
    assert_non_null(strstr(err_msg(), "larger than 100 bytes"));
    assert_int_equal(spawn_fd_count(), before);
    for (int i = 0; i < 2; i++)
        close(fds[i]);
    close(sv[0]);
    close(sv[1]);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void test_fdpass_timeout_and_closed_peer(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(fdpass_socketpair(sv), TD_OK);
    char got[16];
    int rfd;
    size_t len, n;
    long long t0 = now_ms();
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, &rfd, 1, &n, 150), TD_ETIMEOUT);
    long long dt = now_ms() - t0;
    assert_true(dt >= 140 && dt < 5000);
    close(sv[0]);
    assert_int_equal(fdpass_recv(sv[1], got, sizeof got, &len, &rfd, 1, &n, TIMEOUT_MS),
                     TD_ECLOSED);
    /* No SIGPIPE: an error code. */
    assert_int_equal(fdpass_send(sv[1], "x", 1, NULL, 0, TIMEOUT_MS), TD_ECLOSED);
    close(sv[1]);
}

static void test_fdpass_listener_in_private_directory(void **state)
{
    (void)state;
    char dir[] = "/tmp/tandem-fdpass-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    assert_int_equal(fdpass_path(dir, "kvd", path, sizeof path), TD_OK);
    char want[128];
    snprintf(want, sizeof want, "%s/kvd.sock", dir);
    assert_string_equal(path, want);
    assert_int_equal(fdpass_path(dir, "../x", path, sizeof path), TD_EINVAL);
    assert_int_equal(fdpass_path(dir, "", path, sizeof path), TD_EINVAL);
    char longname[120];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    char longpath[256];
    assert_int_equal(fdpass_path(dir, longname, longpath, sizeof longpath), TD_ERANGE);
    assert_int_equal(fdpass_path("/nonexistent-tandem-dir", "kvd", path, sizeof path),
                     TD_ENOENT);

    int connected, nobody;
    assert_int_equal(fdpass_connect(want, &nobody), TD_ENOENT);
    int lsock;
    assert_int_equal(fdpass_listen(want, &lsock), TD_OK);
    int accepted;
    assert_int_equal(fdpass_accept(lsock, 50, &accepted), TD_ETIMEOUT);
    assert_int_equal(fdpass_connect(want, &connected), TD_OK);
    assert_int_equal(fdpass_accept(lsock, TIMEOUT_MS, &accepted), TD_OK);
    int fd = memfd_with("over the listener");
    assert_int_equal(fdpass_send(connected, "fd", 2, &fd, 1, TIMEOUT_MS), TD_OK);
    char got[8];
    int rfd;
    size_t len, n;
    assert_int_equal(fdpass_recv(accepted, got, sizeof got, &len, &rfd, 1, &n, TIMEOUT_MS),
                     TD_OK);
    assert_int_equal(n, 1);
    assert_same_file(rfd, fd);
    close(rfd);
    close(fd);
    close(connected);
    close(accepted);
    /* A second listener on a live path is refused; its probe connection reaches the first
     * listener as a connection that is already closed. */
    int second;
    assert_int_equal(fdpass_listen(want, &second), TD_EBUSY);
    assert_int_equal(fdpass_accept(lsock, TIMEOUT_MS, &accepted), TD_OK);
    assert_int_equal(fdpass_recv(accepted, got, sizeof got, &len, &rfd, 1, &n, TIMEOUT_MS),
                     TD_ECLOSED);
    close(accepted);
    close(lsock);
    /* The socket file of a listener that went away is replaced. */
    assert_int_equal(fdpass_listen(want, &lsock), TD_OK);
    close(lsock);

    /* A directory others can enter is refused. */
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(fdpass_path(dir, "kvd", path, sizeof path), TD_EINVAL);
    assert_non_null(strstr(err_msg(), "must be private"));
    unlink(want);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    const char *mode;
    int sock;
    if (spawn_is_child(argc, argv, &mode, &sock))
        return child_main(mode, sock);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_writes_are_visible_in_both_processes),
        cmocka_unit_test(test_cpu_import_outlives_exporter_process),
        cmocka_unit_test(test_cpu_import_larger_than_memfd_is_refused),
        cmocka_unit_test(test_cpu_import_refuses_fds_that_are_not_its_sealed_memfd),
        cmocka_unit_test(test_cpu_descriptor_from_a_peer_is_validated),
        cmocka_unit_test(test_cpu_peer_cannot_resize_or_reseal_buffer),
        cmocka_unit_test(test_cpu_descriptor_fields_and_generations),
        cmocka_unit_test(test_cuda_kind_without_a_gpu_is_not_supported),
        cmocka_unit_test(test_fdpass_payload_and_fds_arrive_intact),
        cmocka_unit_test(test_fdpass_truncated_control_message_is_an_error_without_leaks),
        cmocka_unit_test(test_fdpass_more_fds_than_expected_are_closed),
        cmocka_unit_test(test_fdpass_oversized_payload_is_an_error_without_leaks),
        cmocka_unit_test(test_fdpass_timeout_and_closed_peer),
        cmocka_unit_test(test_fdpass_listener_in_private_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
