/* Shared daemon plumbing (see daemon.h). */
#include "common/daemon.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/bus.h"
#include "common/fdpass.h"
#include "common/log.h"

static volatile sig_atomic_t daemon_stop_flag;

static void daemon_on_stop(int sig)
{
    (void)sig;
    daemon_stop_flag = 1;
}

td_err daemon_setup(const char *process, const char *runtime_dir, const char *level_name)
{
    int level = LOG_LEVEL_INFO;
    if (level_name && (level = log_level_parse(level_name)) < 0)
        return err_set(TD_EINVAL, "--log-level %s: expected debug, info, warn, error or off",
                       level_name);
    log_init(process, (log_level)level);
    if (runtime_dir && setenv("TANDEM_RUNTIME_DIR", runtime_dir, 1) != 0)
        return err_set(TD_EIO, "cannot set TANDEM_RUNTIME_DIR");
    char dir[4096];
    return bus_runtime_dir(dir, sizeof dir);
}

void daemon_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = daemon_on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

bool daemon_stopping(void)
{
    return daemon_stop_flag != 0;
}

td_err daemon_endpoint(char *url, size_t cap, const char *url_flag, const char *service)
{
    if (url_flag && url_flag[0]) {
        if (strlen(url_flag) >= cap)
            return err_set(TD_ERANGE, "endpoint %s is too long", url_flag);
        strcpy(url, url_flag);
        return TD_OK;
    }
    return bus_endpoint(url, cap, service);
}

td_err daemon_kvd_fd_path(char *path, size_t cap, const char *path_flag)
{
    if (path_flag && path_flag[0]) {
        if (strlen(path_flag) >= cap)
            return err_set(TD_ERANGE, "socket path %s is too long", path_flag);
        strcpy(path, path_flag);
        return TD_OK;
    }
    char dir[4096];
    TD_TRY(bus_runtime_dir(dir, sizeof dir));
    return fdpass_path(dir, "kvd", path, cap);
}

td_err daemon_pack_hello(msg_buf *reply, uint64_t request_id, msg_role role)
{
    msg_hello me = {.role = role, .pid = (uint32_t)getpid(), .protocol = MSG_PROTOCOL_VERSION};
    snprintf(me.build_id, sizeof me.build_id, "tandem");
    return msg_pack_hello(reply, request_id, &me);
}

bool daemon_answer_common(const uint8_t *req, size_t len, const msg_header *h, msg_role role,
                          msg_buf *reply, td_err *err)
{
    if (h->type == MSG_HELLO) {
        msg_hello m;
        *err = msg_unpack_hello(req, len, NULL, &m);
        if (*err == TD_OK)
            *err = daemon_pack_hello(reply, h->request_id, role);
        return true;
    }
    if (h->type == MSG_PING) {
        msg_ping m;
        *err = msg_unpack_ping(req, len, NULL, &m);
        if (*err == TD_OK)
            *err = msg_pack_pong(reply, h->request_id, &m);
        return true;
    }
    return false;
}
