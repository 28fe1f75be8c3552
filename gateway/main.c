/* gateway: the HTTP face of tandem (DESIGN sections 1 and 10).
 *
 * Owns HTTP, JSON, the chat template, the tokenizer, streaming, the request queue (waiting
 * while verifyd is at capacity), auth and metrics. It never loads weights: it opens the model's
 * GGUF file only for its tokenizer, chat template, name and context length.
 *
 * Talks to verifyd only: gen_start / gen_cancel / status_get / hello over verifyd's request
 * socket, and token events that verifyd pushes to this process's PULL socket
 * (gateway-events.ipc in the private runtime directory). It survives verifyd, draftd and kvd
 * restarting: requests get 503 while verifyd is away, in-flight streams end with an error
 * event, and nothing waits without a timeout. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/args.h"
#include "common/bus.h"
#include "common/daemon.h"
#include "common/log.h"
#include "gateway/gateway.h"
#include "gateway/http.h"
#include "gateway/link.h"

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *model = NULL, *model_name = NULL, *api_key = NULL;
    const char *runtime_dir = NULL, *verifyd = NULL, *events = NULL, *level_name = NULL;
    int64_t port = 8080, max_body = 1 << 20, max_tokens_limit = 0, ctx = 0, timeout = 300;
    int64_t responses_kept = 256, responses_mib = 64, responses_background = 32;
    bool help = false;
    const args_opt opts[] = {
        {"host", ARGS_STRING, &host, "TANDEM_HOST", "address to listen on", 0, 0, 0},
        {"port", ARGS_INT, &port, "TANDEM_PORT", "HTTP port (0: any free port)", 0, 65535, 0},
        {"model", ARGS_STRING, &model, "TANDEM_MODEL", "model GGUF file (tokenizer, chat template)", 0, 0, 'm'},
        {"model-name", ARGS_STRING, &model_name, "TANDEM_MODEL_NAME", "model name clients use (default: the file's general.name)", 0, 0, 0},
        {"api-key", ARGS_STRING, &api_key, "TANDEM_API_KEY", "require 'Authorization: Bearer KEY'", 0, 0, 0},
        {"max-body", ARGS_INT, &max_body, "TANDEM_MAX_BODY", "largest request body in bytes (413 above)", 1024, INT32_MAX, 0},
        {"max-tokens-limit", ARGS_INT, &max_tokens_limit, "TANDEM_MAX_TOKENS_LIMIT", "most tokens one request may generate (0: the context bounds it)", 0, INT32_MAX, 0},
        {"ctx", ARGS_INT, &ctx, "TANDEM_CTX", "context positions per request (0: verifyd's)", 0, INT32_MAX, 0},
        {"runtime-dir", ARGS_STRING, &runtime_dir, "TANDEM_RUNTIME_DIR", "private directory of the ipc sockets", 0, 0, 0},
        {"verifyd", ARGS_STRING, &verifyd, "TANDEM_VERIFYD_ENDPOINT", "verifyd's request socket (default ipc://<runtime dir>/verifyd.ipc)", 0, 0, 0},
        {"events", ARGS_STRING, &events, "TANDEM_EVENTS_ENDPOINT", "this gateway's event socket (default ipc://<runtime dir>/gateway-events.ipc)", 0, 0, 0},
        {"timeout", ARGS_INT, &timeout, "TANDEM_TIMEOUT", "seconds a request may wait for verifyd (busy or silent)", 1, 86400, 0},
        {"responses-kept", ARGS_INT, &responses_kept, "TANDEM_RESPONSES_KEPT", "/v1/responses kept in memory for previous_response_id and GET/DELETE (0: none)", 0, 1000000, 0},
        {"responses-mem", ARGS_INT, &responses_mib, "TANDEM_RESPONSES_MEM", "MiB of kept responses at most (the least recently used go first)", 1, 65536, 0},
        {"responses-background", ARGS_INT, &responses_background, "TANDEM_RESPONSES_BACKGROUND", "/v1/responses with background: true running at once (0: refused; the events of as many ended ones are kept, within --responses-mem)", 0, 4096, 0},
        {"log-level", ARGS_STRING, &level_name, "TANDEM_LOG", "debug, info, warn, error or off", 0, 0, 0},
        ARGS_END,
    };
    static const char usage[] = "gateway --model M.gguf [--host H] [--port P] [--api-key KEY]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "gateway: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    char verifyd_url[BUS_URL_MAX], events_url[BUS_URL_MAX];
    if (daemon_setup("gateway", runtime_dir, level_name) != TD_OK ||
        daemon_endpoint(verifyd_url, sizeof verifyd_url, verifyd, "verifyd") != TD_OK ||
        daemon_endpoint(events_url, sizeof events_url, events, "gateway-events") != TD_OK) {
        fprintf(stderr, "gateway: %s\n", err_msg());
        return 1;
    }
    if (!model) {
        fprintf(stderr, "gateway: give --model M.gguf (for the tokenizer and chat template)\n");
        args_usage(usage, opts);
        return 2;
    }

    /* Signals are taken by sigwait below; every thread started from here on blocks them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    gw_config cfg = {
        .model_path = model,
        .model_name = model_name,
        .api_key = api_key && api_key[0] ? api_key : NULL,
        .max_body = max_body,
        .max_tokens_limit = max_tokens_limit,
        .ctx = ctx,
        .timeout_s = timeout,
        .responses_kept = responses_kept,
        .responses_mib = responses_mib,
        .responses_background = responses_background,
    };
    static gw_state g;
    if (gw_init(&g, &cfg) != TD_OK) {
        LOG_ERROR("cannot load %s: %s", model, err_msg());
        return 1;
    }
    link_opts lo = {.verifyd_url = verifyd_url, .events_url = events_url, .call_ms = 2000,
                    .poll_ms = 500, .down_ms = 5000};
    if (link_init(&g.link, &lo) != TD_OK) {
        LOG_ERROR("%s", err_msg());
        gw_free(&g);
        return 1;
    }
    http_server *http = NULL;
    if (http_start(&http, &g, host, (uint16_t)port) != TD_OK) {
        LOG_ERROR("%s", err_msg());
        link_free(g.link);
        gw_free(&g);
        return 1;
    }
    LOG_INFO("serving %s on http://%s:%u (verifyd %s, events %s%s)", g.model_name, host,
             http_port(http), verifyd_url, events_url, cfg.api_key ? ", API key required" : "");

    int sig = 0;
    sigwait(&sigs, &sig);
    LOG_INFO("signal %d: stopping", sig);
    __atomic_store_n(&g.stopping, true, __ATOMIC_SEQ_CST);
    http_stop(http);
    gw_drain(&g);
    link_free(g.link);
    gw_free(&g);
    return 0;
}
