#include "gateway/gateway.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/gguf.h"
#include "common/log.h"
#include "gateway/background.h"
#include "gateway/respstore.h"

/* The served name: --model-name, else general.name, else the file name without ".gguf". */
static void gw_model_name(gw_state *g, const gguf_file *f)
{
    gguf_str s;
    if (g->cfg.model_name && g->cfg.model_name[0]) {
        snprintf(g->model_name, sizeof g->model_name, "%s", g->cfg.model_name);
    } else if (gguf_get_str(f, "general.name", &s) == TD_OK && s.len > 0 &&
               s.len < sizeof g->model_name) {
        memcpy(g->model_name, s.ptr, s.len);
        g->model_name[s.len] = 0;
    } else {
        const char *base = strrchr(g->cfg.model_path, '/');
        base = base ? base + 1 : g->cfg.model_path;
        size_t n = strlen(base);
        if (n > 5 && strcmp(base + n - 5, ".gguf") == 0)
            n -= 5;
        snprintf(g->model_name, sizeof g->model_name, "%.*s", (int)n, base);
    }
}

static void gw_model_ctx(gw_state *g, const gguf_file *f)
{
    gguf_str arch;
    char key[128];
    uint32_t ctx = 0;
    if (gguf_get_str(f, "general.architecture", &arch) == TD_OK && arch.len < 64) {
        snprintf(key, sizeof key, "%.*s.context_length", (int)arch.len, arch.ptr);
        if (gguf_get_u32(f, key, &ctx) != TD_OK)
            ctx = 0;
    }
    g->model_ctx = ctx;
}

td_err gw_init(gw_state *g, const gw_config *cfg)
{
    memset(g, 0, sizeof *g);
    g->cfg = *cfg;
    g->started = (int64_t)time(NULL);
    metrics_init(&g->metrics);
    if (cfg->responses_kept > 0)
        TD_TRY(rstore_init(&g->responses, (size_t)cfg->responses_kept,
                           (size_t)(cfg->responses_mib > 0 ? cfg->responses_mib : 1) << 20));
    if (g->responses && cfg->responses_background > 0)
        TD_TRY(bg_init(&g->background, g, (size_t)cfg->responses_background,
                       (size_t)(cfg->responses_mib > 0 ? cfg->responses_mib : 1) << 20));
    gguf_file *f = NULL;
    td_err e = gguf_open(&f, cfg->model_path);
    if (e != TD_OK) {
        gw_free(g);
        return e;
    }
    e = tok_load_gguf(&g->tok, f);
    if (e != TD_OK) {
        gguf_close(f);
        gw_free(g);
        return err_wrap(e, "%s: tokenizer: ", cfg->model_path);
    }
    gw_model_name(g, f);
    gw_model_ctx(g, f);
    const tok_specials *sp = tok_specials_of(g->tok);
    g->stop_ids[0] = sp->eos;
    g->stop_ids[1] = sp->eot;
    e = chat_model_load(&g->chat, f);
    if (e == TD_OK) {
        e = chat_template_init(&g->tmpl, g->chat.template_text, g->chat.template_len);
        if (e != TD_OK) {
            /* Completions still work; chat requests say why they cannot. */
            LOG_ERROR("%s: the chat template does not parse: %s", cfg->model_path, err_msg());
            g->tmpl = NULL;
        }
    } else if (e == TD_ENOENT) {
        LOG_WARN("%s has no chat template: only /v1/completions will work", cfg->model_path);
    } else {
        LOG_ERROR("%s: reading the chat template: %s", cfg->model_path, err_msg());
    }
    gguf_close(f);
    return TD_OK;
}

void gw_drain(gw_state *g)
{
    bg_drain(g->background);
}

void gw_free(gw_state *g)
{
    bg_drain(g->background);
    bg_free(g->background);
    rstore_free(g->responses);
    chat_template_free(g->tmpl);
    chat_model_free(&g->chat);
    tok_free(g->tok);
    memset(g, 0, sizeof *g);
}
