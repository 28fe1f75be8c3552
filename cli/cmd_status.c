/* tandem status: each service of a running `tandem serve`, its pid, uptime, restarts and
 * health (a ping over its socket; verifyd's own status: ready, draftd attached), then the
 * device the services run on and whether they are clients of an MPS server (the lines the
 * supervisor keeps in <runtime dir>/serve-info.txt).
 * tandem restart SERVICE [--draft DIR]: asks the supervisor to restart a service, e.g. to swap
 * the drafter while requests stream. Both talk to the supervisor's socket, tandem.ipc. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "common/args.h"
#include "common/bus.h"
#include "common/daemon.h"
#include "common/kvclient.h"

/* One call to a service's bus endpoint; reply in *b. */
static td_err st_call(const char *service, msg_buf *b, int timeout_ms)
{
    char url[BUS_URL_MAX];
    bus_client *c;
    TD_TRY(daemon_endpoint(url, sizeof url, NULL, service));
    TD_TRY(bus_client_init(&c, url, NULL));
    td_err e = bus_client_call(c, b->data, b->len, b, timeout_ms);
    bus_client_free(c);
    return e;
}

/* "ok (0.4 ms)", "ready, draftd attached (blocks of 16)", or why not. */
static void st_health(const char *service, char *out, size_t cap)
{
    msg_buf b;
    msg_buf_init(&b);
    if (!strcmp(service, "verifyd")) {
        msg_status st;
        char draft[64];
        if (msg_pack_status_get(&b, 1) == TD_OK && st_call(service, &b, 1000) == TD_OK &&
            msg_unpack_status(b.data, b.len, NULL, &st) == TD_OK) {
            if (st.draft_attached)
                snprintf(draft, sizeof draft, "draftd attached (blocks of %u)", st.block);
            else
                snprintf(draft, sizeof draft, "plain decoding");
            if (st.ready)
                snprintf(out, cap, "ready, %s, %u/%u running, %llu generations", draft,
                         st.active, st.slots, (unsigned long long)st.requests);
            else
                snprintf(out, cap, "not ready (%.200s)", st.not_ready);
        } else {
            snprintf(out, cap, "no answer: %s", err_msg());
        }
    } else if (!strcmp(service, "gateway")) {
        snprintf(out, cap, "-");
    } else {
        msg_ping ping = {.nonce = 1};
        msg_ping pong;
        if (msg_pack_ping(&b, 1, &ping) == TD_OK && st_call(service, &b, 1000) == TD_OK &&
            msg_unpack_pong(b.data, b.len, NULL, &pong) == TD_OK)
            snprintf(out, cap, "ok");
        else
            snprintf(out, cap, "no answer: %s", err_msg());
    }
    msg_buf_free(&b);
}

/* Prints the supervisor's serve-info.txt lines ("device: ...", "mps: ..."). */
static void st_print_info(void)
{
    char dir[PATH_MAX], path[PATH_MAX + 32], line[8192];
    if (bus_runtime_dir(dir, sizeof dir) != TD_OK)
        return;
    snprintf(path, sizeof path, "%s/serve-info.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("device: unknown (no %s)\n", path);
        return;
    }
    while (fgets(line, sizeof line, f))
        fputs(line, stdout);
    fclose(f);
}

static int st_setup(const char *cmd, const char *runtime_dir)
{
    if (daemon_setup("tandem", runtime_dir, "warn") != TD_OK) {
        fprintf(stderr, "tandem %s: %s\n", cmd, err_msg());
        return 1;
    }
    return 0;
}

int cmd_status(int argc, char **argv)
{
    const char *runtime_dir = NULL;
    bool help = false;
    const args_opt opts[] = {
        {"runtime-dir", ARGS_STRING, &runtime_dir, "TANDEM_RUNTIME_DIR", "the runtime directory of tandem serve", 0, 0, 0},
        ARGS_END,
    };
    static const char usage[] = "tandem status [--runtime-dir DIR]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "tandem status: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (st_setup("status", runtime_dir))
        return 1;
    msg_buf b;
    msg_buf_init(&b);
    msg_svc_list list;
    if (msg_pack_svc_list_get(&b, 1) != TD_OK || st_call("tandem", &b, 2000) != TD_OK ||
        msg_unpack_svc_list(b.data, b.len, NULL, &list) != TD_OK) {
        fprintf(stderr, "tandem status: tandem serve does not answer (%s)\n", err_msg());
        msg_buf_free(&b);
        return 1;
    }
    msg_buf_free(&b);
    printf("%-8s %8s %10s %8s  %s\n", "service", "pid", "uptime", "restarts", "health");
    for (uint32_t i = 0; i < list.n; i++) {
        const msg_svc *v = &list.svc[i];
        char health[256], pid[16], up[32];
        if (v->pid)
            st_health(v->name, health, sizeof health);
        else
            snprintf(health, sizeof health, "down (restarting)");
        snprintf(pid, sizeof pid, "%u", v->pid);
        snprintf(up, sizeof up, "%.1fs", (double)v->uptime_ms / 1000.0);
        printf("%-8s %8s %10s %8u  %s\n", v->name, v->pid ? pid : "-", v->pid ? up : "-",
               v->restarts, health);
    }
    st_print_info();
    return 0;
}

int cmd_restart(int argc, char **argv)
{
    const char *runtime_dir = NULL, *draft = NULL, *pos[1];
    int n_pos = 0;
    bool help = false;
    const args_opt opts[] = {
        {"draft", ARGS_STRING, &draft, NULL, "draftd: the drafter folder to switch to", 0, 0, 0},
        {"runtime-dir", ARGS_STRING, &runtime_dir, "TANDEM_RUNTIME_DIR", "the runtime directory of tandem serve", 0, 0, 0},
        ARGS_END,
    };
    static const char usage[] = "tandem restart SERVICE [--draft DIR]";
    if (args_parse(argc, argv, 1, opts, pos, 1, &n_pos, &help) != TD_OK) {
        fprintf(stderr, "tandem restart: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help || n_pos != 1) {
        args_usage(usage, opts);
        return help ? 0 : 2;
    }
    if (st_setup("restart", runtime_dir))
        return 1;
    msg_svc_restart m;
    memset(&m, 0, sizeof m);
    if (strlen(pos[0]) > MSG_SVC_NAME_MAX) {
        fprintf(stderr, "tandem restart: unknown service %s\n", pos[0]);
        return 2;
    }
    strcpy(m.name, pos[0]);
    if (draft) {
        char real[PATH_MAX];
        if (!realpath(draft, real) || strlen(real) > MSG_PATH_MAX) {
            fprintf(stderr, "tandem restart: %s: no such folder\n", draft);
            return 2;
        }
        strcpy(m.draft, real);
    }
    msg_buf b;
    msg_buf_init(&b);
    msg_ack ack;
    td_err e = msg_pack_svc_restart(&b, 1, &m);
    if (e == TD_OK)
        e = st_call("tandem", &b, 30000);
    if (e == TD_OK && msg_unpack_ack(b.data, b.len, NULL, &ack) != TD_OK)
        e = kvc_reply_error(&b, "restart");
    msg_buf_free(&b);
    if (e != TD_OK) {
        fprintf(stderr, "tandem restart %s: %s\n", m.name, err_msg());
        return 1;
    }
    printf("%s restarted (pid %llu)\n", m.name, (unsigned long long)ack.id);
    return 0;
}
