/* kvd: owns the memory that outlives a request or a process (DESIGN section 1): the target
 * pool (attention KV, DeltaNet state and rollback record, feature ring of every sequence
 * slot) and the draft pool (the drafter's context of every slot), laid out by
 * common/kvlayout; which slot holds which sequence; the prefix cache of finished sequences
 * with LRU eviction; and reclaiming the slots of processes that died.
 *
 * The pools are of the cpu kind (memfd) or, with --device cuda[:N], of the cuda kind (VMM
 * allocations on that GPU); the proposal pool carries sampled draft distributions from
 * draftd to verifyd, and on a GPU kvd passes verifyd's token embedding and LM head on to
 * draftd.
 *
 * Talks to verifyd and draftd: kv_attach over the fd socket (<runtime dir>/kvd.sock,
 * answered with the pools' fds; the connection then stays open as the attached process's
 * heartbeat), and kv_open / kv_close / hello / ping over kvd.ipc. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/args.h"
#include "common/bus.h"
#include "common/daemon.h"
#include "common/devarg.h"
#include "common/fdpass.h"
#include "common/log.h"
#include "kvd/server.h"

#define KVD_RECLAIM_MS 500 /* how often owners' pids are checked */

static long long kvd_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void kvd_conn_drop(kvd *k, int i)
{
    kvd_conn *c = &k->conns[i];
    uint32_t pid = c->pid;
    close(c->fd);
    *c = (kvd_conn){.fd = -1};
    if (!pid)
        return;
    for (int j = 0; j < KVD_CONNS_MAX; j++)
        if (k->conns[j].fd >= 0 && k->conns[j].pid == pid)
            return; /* the same process is still attached on another connection */
    kvd_reclaim_owner(k, pid);
}

/* One message from an attached connection: an attach (answered with the pools) or anything
 * else (answered with an error, then the connection is closed). */
static void kvd_conn_serve(kvd *k, int i)
{
    kvd_conn *c = &k->conns[i];
    uint8_t buf[FDPASS_MAX_PAYLOAD];
    int in_fds[FDPASS_MAX_FDS], out_fds[MSG_POOLS_MAX];
    size_t len = 0, n_in = 0, n_out = 0;
    td_err e = fdpass_recv(c->fd, buf, sizeof buf, &len, in_fds, FDPASS_MAX_FDS, &n_in, 100);
    if (e != TD_OK) {
        for (size_t j = 0; j < n_in; j++)
            close(in_fds[j]);
    }
    if (e == TD_ETIMEOUT)
        return;
    if (e != TD_OK) {
        if (e != TD_ECLOSED)
            LOG_WARN("fd socket: %s", err_msg());
        kvd_conn_drop(k, i);
        return;
    }
    msg_buf reply;
    msg_buf_init(&reply);
    uint32_t pid = 0;
    msg_role role = 0;
    e = kvd_attach(k, buf, len, in_fds, n_in, &reply, out_fds, &n_out, &pid, &role);
    for (size_t j = 0; j < n_in; j++)
        close(in_fds[j]); /* verifyd's heads: kvd holds its own import */
    if (e != TD_OK) {
        /* a peer that retries a refused attach gets the same answer: said once, not each time */
        static char last[MSG_ERROR_MAX + 1];
        if (strcmp(last, err_msg()) != 0) {
            LOG_WARN("attach refused: %s", err_msg());
            snprintf(last, sizeof last, "%s", err_msg());
        } else {
            LOG_DEBUG("attach refused again: %s", err_msg());
        }
        msg_error m = {.code = e};
        snprintf(m.message, sizeof m.message, "%s", err_msg());
        msg_header h;
        uint64_t rid = msg_unpack_header(buf, len, &h) == TD_OK ? h.request_id : 0;
        if (msg_pack_error(&reply, rid, &m) == TD_OK)
            fdpass_send(c->fd, reply.data, reply.len, NULL, 0, 1000);
        msg_buf_free(&reply);
        kvd_conn_drop(k, i);
        return;
    }
    e = fdpass_send(c->fd, reply.data, reply.len, out_fds, n_out, 1000);
    for (size_t j = 0; j < n_out; j++)
        close(out_fds[j]);
    msg_buf_free(&reply);
    if (e != TD_OK) {
        kvd_conn_drop(k, i);
        return;
    }
    c->pid = pid;
    c->role = role;
    LOG_INFO("%s (pid %u) attached", role == MSG_ROLE_VERIFYD ? "verifyd" : "draftd", pid);
}

static void kvd_accept(kvd *k, int listen_fd)
{
    int fd;
    if (fdpass_accept(listen_fd, 0, &fd) != TD_OK) {
        LOG_WARN("fd socket: %s", err_msg());
        return;
    }
    for (int i = 0; i < KVD_CONNS_MAX; i++)
        if (k->conns[i].fd < 0) {
            k->conns[i] = (kvd_conn){.fd = fd};
            return;
        }
    LOG_WARN("fd socket: %d connections already; refusing another", KVD_CONNS_MAX);
    close(fd);
}

/* The fd socket and the reclaim timer, until a stop signal. */
static void kvd_loop(kvd *k, int listen_fd)
{
    long long next_reclaim = kvd_now_ms() + KVD_RECLAIM_MS;
    while (!daemon_stopping()) {
        struct pollfd p[1 + KVD_CONNS_MAX];
        int idx[1 + KVD_CONNS_MAX], n = 0;
        p[n++] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
        for (int i = 0; i < KVD_CONNS_MAX; i++)
            if (k->conns[i].fd >= 0) {
                idx[n] = i;
                p[n++] = (struct pollfd){.fd = k->conns[i].fd, .events = POLLIN};
            }
        int r = poll(p, (nfds_t)n, KVD_RECLAIM_MS);
        if (r < 0 && errno != EINTR) {
            LOG_ERROR("poll: %s", strerror(errno));
            break;
        }
        if (r > 0 && (p[0].revents & POLLIN))
            kvd_accept(k, listen_fd);
        for (int j = 1; r > 0 && j < n; j++) {
            if (!p[j].revents)
                continue;
            if (p[j].revents & POLLIN)
                kvd_conn_serve(k, idx[j]);
            else
                kvd_conn_drop(k, idx[j]);
        }
        if (kvd_now_ms() >= next_reclaim) {
            kvd_reclaim_dead(k);
            next_reclaim = kvd_now_ms() + KVD_RECLAIM_MS;
        }
    }
}

int main(int argc, char **argv)
{
    const char *runtime_dir = NULL, *log_level = NULL, *endpoint = NULL, *fd_socket = NULL;
    const char *device = "cpu";
    int64_t slots = 0, workers = 4, gpu_mem = 0;
    bool help = false;
    const args_opt opts[] = {
        {"runtime-dir", ARGS_STRING, &runtime_dir, "TANDEM_RUNTIME_DIR", "private directory of the sockets", 0, 0, 0},
        {"log-level", ARGS_STRING, &log_level, "TANDEM_LOG", "debug, info, warn, error or off", 0, 0, 0},
        {"slots", ARGS_INT, &slots, "TANDEM_SLOTS", "sequences held at once (running and cached); 0: 16 on the CPU, on a GPU as many as fit (up to 16) once verifyd attaches", 0, KVL_SLOTS_MAX, 0},
        {"gpu-mem", ARGS_INT, &gpu_mem, "TANDEM_GPU_MEM", "MiB of the GPU that all services together may use when the pools are sized to it (0: all of it)", 0, 1 << 24, 0},
        {"endpoint", ARGS_STRING, &endpoint, "TANDEM_KVD_ENDPOINT", "kvd's bus endpoint (default ipc://<runtime dir>/kvd.ipc)", 0, 0, 0},
        {"fd-socket", ARGS_STRING, &fd_socket, "TANDEM_KVD_FD_SOCKET", "kvd's fd socket (default <runtime dir>/kvd.sock)", 0, 0, 0},
        {"workers", ARGS_INT, &workers, NULL, "bus requests served at once", 1, 64, 0},
        {"device", ARGS_STRING, &device, "TANDEM_DEVICE", "where the pools live: cpu, cuda or cuda:N", 0, 0, 0},
        ARGS_END,
    };
    static const char usage[] =
        "kvd [--slots N] [--gpu-mem MIB] [--device cpu|cuda[:N]] [--runtime-dir DIR]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "kvd: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    char url[BUS_URL_MAX], path[256];
    if (daemon_setup("kvd", runtime_dir, log_level) != TD_OK ||
        daemon_endpoint(url, sizeof url, endpoint, "kvd") != TD_OK ||
        daemon_kvd_fd_path(path, sizeof path, fd_socket) != TD_OK) {
        fprintf(stderr, "kvd: %s\n", err_msg());
        return 1;
    }
    daemon_signals();
    int ordinal = -1;
    cudrv_device dev = {0};
    if (devarg_parse(device, &ordinal) != TD_OK ||
        (ordinal >= 0 && (cudrv_load() != TD_OK ||
                          cudrv_device_open_ordinal(&dev, ordinal) != TD_OK))) {
        LOG_ERROR("--device %s: %s", device, err_msg());
        return 1;
    }
    if (gpu_mem && ordinal < 0)
        LOG_WARN("--gpu-mem sizes pools on a GPU; these are in host memory (--device cpu)");
    kvd k;
    td_err ie =
        kvd_init(&k, (uint32_t)slots, (uint64_t)gpu_mem << 20, ordinal >= 0 ? &dev : NULL);
    if (ordinal >= 0)
        cudrv_device_close(&dev);
    if (ie != TD_OK) {
        LOG_ERROR("%s", err_msg());
        return 1;
    }
    int listen_fd = -1;
    bus_server *srv = NULL;
    bus_opts bo;
    bus_opts_default(&bo);
    bo.workers = (int)workers;
    bo.recv_timeout_ms = 200;
    int rc = 1;
    if (fdpass_listen(path, &listen_fd) != TD_OK ||
        bus_server_init(&srv, url, &bo, kvd_handle, &k) != TD_OK) {
        LOG_ERROR("%s", err_msg());
        goto out;
    }
    if (k.slots_auto && ordinal >= 0)
        LOG_INFO("serving slots sized to the GPU at verifyd's attach (pools on %s) on %s and %s",
                 device, url, path);
    else
        LOG_INFO("serving %u slots (pools on %s) on %s and %s", k.slots, device, url, path);
    kvd_loop(&k, listen_fd);
    LOG_INFO("stopping");
    rc = 0;
out:
    bus_server_free(srv);
    if (listen_fd >= 0) {
        close(listen_fd);
        unlink(path);
    }
    kvd_free(&k);
    return rc;
}
