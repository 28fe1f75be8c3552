/* Shared buffers of the cuda kind and interprocess CUDA events between real processes (the
 * test binary starts itself again as the peer, tests/support/spawn.h). Skips (77) without a
 * CUDA driver and device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cudrv.h"
#include "common/fdpass.h"
#include "common/shbuf.h"
#include "tests/support/gpu_check.h"
#include "tests/support/shbuf_wire.h"
#include "tests/support/spawn.h"

#define SKIP_EXIT 77

#ifndef TANDEM_HAVE_CUDA

GPU_CHECK_SKIP_MAIN

#else

GPU_CHECK_SANITIZER_OPTIONS

#define TIMEOUT_MS 60000
/* Not a multiple of the allocation granularity: the exact size must survive. */
#define BUF_SIZE ((size_t)(8 << 20) + 123)
/* Large enough that the producer's queued work takes milliseconds. */
#define EVENT_BUF_SIZE ((size_t)128 << 20)
#define EVENT_PASSES 96
#define EVENT_FINAL 0xA5

/* ---- byte patterns, checked in full after a copy to the host ---- */

static td_err dev_fill(uint64_t ptr, size_t n, unsigned seed)
{
    uint8_t *h = malloc(n);
    TD_ASSERT(h);
    for (size_t i = 0; i < n; i++)
        h[i] = sw_pattern_byte(i, seed);
    td_err e = cudrv_check(cudrv_get()->cuMemcpyHtoD_v2((CUdeviceptr)ptr, h, n), "cuMemcpyHtoD");
    free(h);
    return e;
}

/* -1 when every byte matches the pattern (seed >= 0) or the constant -seed-1 (seed < 0);
 * else the first index that does not; -2 when the copy itself failed. */
static long dev_find_mismatch(uint64_t ptr, size_t n, int seed)
{
    uint8_t *h = malloc(n);
    TD_ASSERT(h);
    long bad = -1;
    if (cudrv_check(cudrv_get()->cuMemcpyDtoH_v2(h, (CUdeviceptr)ptr, n), "cuMemcpyDtoH") !=
        TD_OK)
        bad = -2;
    for (size_t i = 0; bad == -1 && i < n; i++) {
        uint8_t want = seed >= 0 ? sw_pattern_byte(i, (unsigned)seed) : (uint8_t)(-seed - 1);
        if (h[i] != want)
            bad = (long)i;
    }
    free(h);
    return bad;
}

/* The device every test uses, opened by UUID the way a daemon is told it. */
static cudrv_device test_dev;
static char test_dev_uuid[CUDRV_UUID_STR_LEN];

static int group_setup(void **state)
{
    (void)state;
    cudrv_device first;
    if (cudrv_device_open_ordinal(&first, 0) != TD_OK)
        return -1;
    cudrv_uuid_format(first.uuid, test_dev_uuid);
    cudrv_device_close(&first);
    if (cudrv_device_open(&test_dev, test_dev_uuid) != TD_OK || test_dev.ordinal != 0)
        return -1;
    printf("device: %s %s\n", test_dev_uuid, test_dev.name);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    cudrv_device_close(&test_dev);
    return 0;
}

/* ---- child modes ---- */

/* Imports the parent's buffer, checks pattern 1, writes pattern 2, later checks pattern 3. */
static int child_cuda_peer(int sock)
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
    uint64_t ptr = shbuf_devptr(sb);
    long bad = dev_find_mismatch(ptr, BUF_SIZE, 1);
    if (bad != -1 || shbuf_size(sb) != BUF_SIZE || shbuf_host(sb)) {
        err_set(TD_EINVAL, "first wrong byte at %ld", bad);
        return sw_child_fail(sock, "pattern 1", TIMEOUT_MS);
    }
    if (dev_fill(ptr, BUF_SIZE, 2) != TD_OK)
        return sw_child_fail(sock, "writing pattern 2", TIMEOUT_MS);
    sw_send(sock, "ok", NULL, NULL, -1, TIMEOUT_MS);
    if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK || strcmp(w.text, "check 3") != 0)
        return sw_child_fail(sock, "waiting for check 3", TIMEOUT_MS);
    bad = dev_find_mismatch(ptr, BUF_SIZE, 3);
    if (bad != -1) {
        err_set(TD_EINVAL, "first wrong byte at %ld", bad);
        return sw_child_fail(sock, "pattern 3", TIMEOUT_MS);
    }
    sw_send(sock, "ok", NULL, NULL, -1, TIMEOUT_MS);
    shbuf_release(sb);
    return 0;
}

/* Creates a buffer on the device the parent names, hands it over, writes pattern 5 once the
 * parent has mapped it, then releases everything and exits. */
static int child_cuda_exporter(int sock)
{
    sw_msg w;
    int fd;
    if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK || strncmp(w.text, "device ", 7) != 0)
        return sw_child_fail(sock, "waiting for the device", TIMEOUT_MS);
    cudrv_device dev;
    if (cudrv_device_open(&dev, w.text + 7) != TD_OK)
        return sw_child_fail(sock, "opening the device", TIMEOUT_MS);
    shbuf *sb;
    if (shbuf_create(&sb, SHBUF_KIND_CUDA, "test.gpu-orphan", BUF_SIZE, &dev) != TD_OK)
        return sw_child_fail(sock, "create", TIMEOUT_MS);
    cudrv_device_close(&dev); /* the buffer holds its own reference */
    if (dev_fill(shbuf_devptr(sb), BUF_SIZE, 4) != TD_OK)
        return sw_child_fail(sock, "writing pattern 4", TIMEOUT_MS);
    shbuf_desc desc;
    if (shbuf_export(sb, &desc, &fd) != TD_OK)
        return sw_child_fail(sock, "export", TIMEOUT_MS);
    if (sw_send(sock, "buffer", &desc, NULL, fd, TIMEOUT_MS) != TD_OK)
        return sw_child_fail(sock, "send", TIMEOUT_MS);
    close(fd);
    if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK || strcmp(w.text, "imported") != 0)
        return sw_child_fail(sock, "waiting for the import", TIMEOUT_MS);
    if (dev_fill(shbuf_devptr(sb), BUF_SIZE, 5) != TD_OK)
        return sw_child_fail(sock, "writing pattern 5", TIMEOUT_MS);
    shbuf_release(sb);
    sw_send(sock, "ok", NULL, NULL, -1, TIMEOUT_MS);
    return 0;
}

/* Tries to import each buffer it is sent and reports "imported" or "refused <code>: why". */
static int child_cuda_import_probe(int sock)
{
    for (;;) {
        sw_msg w;
        int fd;
        if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK)
            return sw_child_fail(sock, "receiving", TIMEOUT_MS);
        if (strcmp(w.text, "quit") == 0)
            return 0;
        shbuf *sb;
        td_err e = shbuf_import(&sb, &w.desc, fd);
        if (fd >= 0)
            close(fd);
        char text[256];
        if (e == TD_OK)
            snprintf(text, sizeof text, "imported");
        else
            snprintf(text, sizeof text, "refused %s: %s", err_name(e), err_msg());
        shbuf_release(sb);
        sw_send(sock, text, NULL, NULL, -1, TIMEOUT_MS);
    }
}

/* Imports the parent's buffer, queues many fills on its own stream ending with
 * EVENT_FINAL, records the interprocess event and says "ready" at once, without
 * synchronising: only the event orders the parent's read after this work. */
static int child_cuda_producer(int sock)
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
    cudrv_device dev;
    shbuf_event *ev;
    shbuf_event_desc edesc;
    if (cudrv_device_open_uuid(&dev, w.desc.device_uuid) != TD_OK ||
        shbuf_event_create(&ev, &dev) != TD_OK || shbuf_event_export(ev, &edesc) != TD_OK)
        return sw_child_fail(sock, "event", TIMEOUT_MS);
    if (sw_send(sock, "event", NULL, &edesc, -1, TIMEOUT_MS) != TD_OK)
        return sw_child_fail(sock, "sending the event", TIMEOUT_MS);
    if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK || strcmp(w.text, "go") != 0)
        return sw_child_fail(sock, "waiting for go", TIMEOUT_MS);
    const cudrv_api *api = cudrv_get();
    CUstream stream;
    if (cudrv_device_bind(&dev) != TD_OK ||
        cudrv_check(api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate") !=
            TD_OK)
        return sw_child_fail(sock, "stream", TIMEOUT_MS);
    CUdeviceptr ptr = (CUdeviceptr)shbuf_devptr(sb);
    for (int i = 0; i < EVENT_PASSES; i++) {
        unsigned char v = i + 1 == EVENT_PASSES ? EVENT_FINAL : (unsigned char)(0x10 + i % 64);
        if (cudrv_check(api->cuMemsetD8Async(ptr, v, EVENT_BUF_SIZE, stream), "cuMemsetD8Async") !=
            TD_OK)
            return sw_child_fail(sock, "fill", TIMEOUT_MS);
    }
    if (shbuf_event_record(ev, stream) != TD_OK)
        return sw_child_fail(sock, "record", TIMEOUT_MS);
    sw_send(sock, "ready", NULL, NULL, -1, TIMEOUT_MS);
    /* The parent releases its imported event before saying done: an event must outlive
     * its importers' use of it. */
    if (sw_recv(sock, &w, &fd, TIMEOUT_MS) != TD_OK || strcmp(w.text, "done") != 0)
        return sw_child_fail(sock, "waiting for done", TIMEOUT_MS);
    api->cuStreamSynchronize(stream);
    api->cuStreamDestroy_v2(stream);
    shbuf_event_release(ev);
    cudrv_device_close(&dev);
    shbuf_release(sb);
    sw_send(sock, "ok", NULL, NULL, -1, TIMEOUT_MS);
    return 0;
}

static int child_main(const char *mode, int sock)
{
    int rc = 2;
    if (cudrv_load() != TD_OK)
        rc = sw_child_fail(sock, "cudrv_load", TIMEOUT_MS);
    else if (strcmp(mode, "cuda-peer") == 0)
        rc = child_cuda_peer(sock);
    else if (strcmp(mode, "cuda-exporter") == 0)
        rc = child_cuda_exporter(sock);
    else if (strcmp(mode, "cuda-import-probe") == 0)
        rc = child_cuda_import_probe(sock);
    else if (strcmp(mode, "cuda-producer") == 0)
        rc = child_cuda_producer(sock);
    else
        fprintf(stderr, "unknown child mode %s\n", mode);
    close(sock);
    return rc;
}

/* ---- tests ---- */

static void test_cuda_writes_are_visible_in_both_processes(void **state)
{
    (void)state;
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CUDA, "test.gpu-both", BUF_SIZE, &test_dev),
                     TD_OK);
    uint64_t ptr = shbuf_devptr(sb);
    assert_true(ptr != 0);
    assert_null(shbuf_host(sb));
    assert_int_equal(shbuf_size(sb), BUF_SIZE);
    assert_memory_equal(shbuf_info(sb)->device_uuid, test_dev.uuid, CUDRV_UUID_BYTES);
    assert_int_equal(cudrv_device_bind(&test_dev), TD_OK);
    assert_int_equal(dev_find_mismatch(ptr, BUF_SIZE, -1), -1); /* created zero-filled */
    assert_int_equal(dev_fill(ptr, BUF_SIZE, 1), TD_OK);

    int sock;
    pid_t pid;
    assert_int_equal(spawn_self("cuda-peer", &sock, &pid), 0);
    shbuf_desc desc;
    int fd;
    assert_int_equal(shbuf_export(sb, &desc, &fd), TD_OK);
    assert_int_equal(desc.kind, SHBUF_KIND_CUDA);
    assert_int_equal(desc.size, BUF_SIZE);
    assert_int_equal(sw_send(sock, "buffer", &desc, NULL, fd, TIMEOUT_MS), TD_OK);
    close(fd);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK); /* the child saw pattern 1 and wrote pattern 2 */
    assert_int_equal(cudrv_device_bind(&test_dev), TD_OK);
    assert_int_equal(dev_find_mismatch(ptr, BUF_SIZE, 2), -1);
    assert_int_equal(dev_fill(ptr, BUF_SIZE, 3), TD_OK);
    assert_int_equal(sw_send(sock, "check 3", NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK);
    assert_int_equal(spawn_wait(pid, TIMEOUT_MS), 0);
    close(sock);
    shbuf_release(sb);
}

static void test_cuda_import_outlives_exporter_process_and_is_passed_on(void **state)
{
    (void)state;
    int sock;
    pid_t pid;
    assert_int_equal(spawn_self("cuda-exporter", &sock, &pid), 0);
    char text[sizeof "device " + CUDRV_UUID_STR_LEN];
    snprintf(text, sizeof text, "device %s", test_dev_uuid);
    assert_int_equal(sw_send(sock, text, NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    sw_msg w;
    int fd;
    assert_int_equal(sw_recv(sock, &w, &fd, TIMEOUT_MS), TD_OK);
    assert_string_equal(w.text, "buffer");
    assert_true(fd >= 0);
    assert_string_equal(w.desc.name, "test.gpu-orphan");
    assert_memory_equal(w.desc.device_uuid, test_dev.uuid, CUDRV_UUID_BYTES);
    shbuf *sb;
    assert_int_equal(shbuf_import(&sb, &w.desc, fd), TD_OK);
    close(fd);
    uint64_t ptr = shbuf_devptr(sb);
    assert_int_equal(dev_find_mismatch(ptr, BUF_SIZE, 4), -1);
    assert_int_equal(sw_send(sock, "imported", NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK);
    /* The exporter released its buffer and exited: reap it before touching the memory. */
    assert_int_equal(spawn_wait(pid, TIMEOUT_MS), 0);
    close(sock);
    assert_int_equal(cudrv_device_bind(&test_dev), TD_OK);
    assert_int_equal(dev_find_mismatch(ptr, BUF_SIZE, 5), -1);
    assert_int_equal(dev_fill(ptr, BUF_SIZE, 6), TD_OK);
    assert_int_equal(dev_find_mismatch(ptr, BUF_SIZE, 6), -1);

    /* An imported buffer is passed on to a third process (as kvd hands verifyd's heads to
     * draftd): that peer sees and writes the same memory. */
    assert_int_equal(dev_fill(ptr, BUF_SIZE, 1), TD_OK);
    assert_int_equal(spawn_self("cuda-peer", &sock, &pid), 0);
    shbuf_desc desc;
    assert_int_equal(shbuf_export(sb, &desc, &fd), TD_OK);
    assert_string_equal(desc.name, "test.gpu-orphan");
    assert_int_equal(desc.size, BUF_SIZE);
    assert_int_equal(sw_send(sock, "buffer", &desc, NULL, fd, TIMEOUT_MS), TD_OK);
    close(fd);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK); /* saw pattern 1, wrote 2 */
    assert_int_equal(cudrv_device_bind(&test_dev), TD_OK);
    assert_int_equal(dev_find_mismatch(ptr, BUF_SIZE, 2), -1);
    assert_int_equal(dev_fill(ptr, BUF_SIZE, 3), TD_OK);
    assert_int_equal(sw_send(sock, "check 3", NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK);
    assert_int_equal(spawn_wait(pid, TIMEOUT_MS), 0);
    close(sock);
    shbuf_release(sb);
}

static void probe(int sock, const shbuf_desc *desc, int fd, const char *want_prefix)
{
    assert_int_equal(sw_send(sock, "try", desc, NULL, fd, TIMEOUT_MS), TD_OK);
    sw_msg w;
    int rfd;
    assert_int_equal(sw_recv(sock, &w, &rfd, TIMEOUT_MS), TD_OK);
    if (strncmp(w.text, want_prefix, strlen(want_prefix)) != 0)
        fail_msg("want \"%s...\", child said \"%s\"", want_prefix, w.text);
}

static void test_cuda_import_refuses_oversized_descriptor_and_foreign_fd(void **state)
{
    (void)state;
    /* The allocation is exactly one granule; the test asks the driver for its size. */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = test_dev.ordinal;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    assert_int_equal(cudrv_check(cudrv_get()->cuMemGetAllocationGranularity(
                                     &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                                 "granularity"),
                     TD_OK);
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CUDA, "test.gpu-size", gran, &test_dev), TD_OK);
    shbuf_desc desc;
    int fd;
    assert_int_equal(shbuf_export(sb, &desc, &fd), TD_OK);

    int sock;
    pid_t pid;
    assert_int_equal(spawn_self("cuda-import-probe", &sock, &pid), 0);
    probe(sock, &desc, fd, "imported");
    shbuf_desc big = desc;
    big.size = gran + 1;
    probe(sock, &big, fd, "refused EINVAL");
    int memfd = memfd_create("not-cuda", MFD_CLOEXEC);
    assert_true(memfd >= 0);
    assert_int_equal(ftruncate(memfd, (off_t)gran), 0);
    probe(sock, &desc, memfd, "refused EINVAL");
    close(memfd);
    shbuf_desc nowhere = desc;
    memset(nowhere.device_uuid, 0xee, CUDRV_UUID_BYTES);
    probe(sock, &nowhere, fd, "refused ENOENT");
    /* Still importable after the refusals. */
    probe(sock, &desc, fd, "imported");
    assert_int_equal(sw_send(sock, "quit", NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    assert_int_equal(spawn_wait(pid, TIMEOUT_MS), 0);
    close(sock);
    close(fd);
    shbuf_release(sb);
}

static void test_cuda_event_orders_consumer_after_producer(void **state)
{
    (void)state;
    shbuf *sb;
    assert_int_equal(shbuf_create(&sb, SHBUF_KIND_CUDA, "test.gpu-event", EVENT_BUF_SIZE,
                                  &test_dev),
                     TD_OK);
    int sock;
    pid_t pid;
    assert_int_equal(spawn_self("cuda-producer", &sock, &pid), 0);
    shbuf_desc desc;
    int fd;
    assert_int_equal(shbuf_export(sb, &desc, &fd), TD_OK);
    assert_int_equal(sw_send(sock, "buffer", &desc, NULL, fd, TIMEOUT_MS), TD_OK);
    close(fd);
    sw_msg w;
    assert_int_equal(sw_recv(sock, &w, &fd, TIMEOUT_MS), TD_OK);
    assert_string_equal(w.text, "event");
    assert_memory_equal(w.event.device_uuid, test_dev.uuid, CUDRV_UUID_BYTES);
    shbuf_event *ev;
    assert_int_equal(shbuf_event_import(&ev, &w.event), TD_OK);

    const cudrv_api *api = cudrv_get();
    assert_int_equal(cudrv_device_bind(&test_dev), TD_OK);
    CUstream stream;
    assert_int_equal(cudrv_check(api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "stream"),
                     TD_OK);
    uint8_t *host = malloc(EVENT_BUF_SIZE);
    assert_non_null(host);
    memset(host, 0x5a, EVENT_BUF_SIZE);

    assert_int_equal(sw_send(sock, "go", NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    assert_int_equal(sw_recv(sock, &w, &fd, TIMEOUT_MS), TD_OK);
    assert_string_equal(w.text, "ready");
    /* GPU-side wait: the copy on our stream starts after the producer's last fill. */
    assert_int_equal(shbuf_event_wait(ev, stream), TD_OK);
    assert_int_equal(cudrv_check(api->cuMemcpyDtoHAsync_v2(host, (CUdeviceptr)shbuf_devptr(sb),
                                                          EVENT_BUF_SIZE, stream),
                                 "copy"),
                     TD_OK);
    assert_int_equal(cudrv_check(api->cuStreamSynchronize(stream), "sync"), TD_OK);
    for (size_t i = 0; i < EVENT_BUF_SIZE; i++)
        if (host[i] != EVENT_FINAL)
            fail_msg("byte %zu is 0x%02x, want 0x%02x: read before the producer finished", i,
                     host[i], EVENT_FINAL);
    /* Host-side wait on the same event. */
    assert_int_equal(shbuf_event_sync(ev), TD_OK);
    assert_int_equal(dev_find_mismatch(shbuf_devptr(sb), EVENT_BUF_SIZE, -EVENT_FINAL - 1), -1);

    api->cuStreamDestroy_v2(stream);
    free(host);
    shbuf_event_release(ev);
    assert_int_equal(sw_send(sock, "done", NULL, NULL, -1, TIMEOUT_MS), TD_OK);
    assert_int_equal(sw_expect_ok(sock, TIMEOUT_MS), TD_OK);
    assert_int_equal(spawn_wait(pid, TIMEOUT_MS), 0);
    close(sock);
    shbuf_release(sb);
}

int main(int argc, char **argv)
{
    const char *mode;
    int sock;
    if (spawn_is_child(argc, argv, &mode, &sock))
        return child_main(mode, sock);
    if (!cudrv_available()) {
        printf("skipped: %s\n", err_msg()[0] ? err_msg() : "no CUDA device");
        return SKIP_EXIT;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_writes_are_visible_in_both_processes),
        cmocka_unit_test(test_cuda_import_outlives_exporter_process_and_is_passed_on),
        cmocka_unit_test(test_cuda_import_refuses_oversized_descriptor_and_foreign_fd),
        cmocka_unit_test(test_cuda_event_orders_consumer_after_producer),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

#endif
