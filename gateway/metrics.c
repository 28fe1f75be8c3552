#include "gateway/metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/tbuf.h"

static const char *const MET_EP_NAMES[MET_EP_COUNT] = {
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health",
    "/metrics",             "/tokenize",       "/detokenize",   "other",
};

void metrics_init(gw_metrics *m)
{
    memset(m, 0, sizeof *m);
}

void metrics_add(int64_t *field, int64_t delta)
{
    __atomic_add_fetch(field, delta, __ATOMIC_RELAXED);
}

void metrics_addu(uint64_t *field, uint64_t delta)
{
    __atomic_add_fetch(field, delta, __ATOMIC_RELAXED);
}

void metrics_request(gw_metrics *m, metrics_endpoint ep, int status)
{
    if (ep < 0 || ep >= MET_EP_COUNT)
        ep = MET_EP_OTHER;
    if (status < 0 || status >= MET_STATUS_MAX)
        status = 0;
    metrics_addu(&m->requests[ep][status], 1);
}

void metrics_tokens(gw_metrics *m, uint64_t n)
{
    metrics_addu(&m->generated_tokens, n);
    uint64_t now = (uint64_t)time(NULL);
    size_t b = now % MET_RATE_WINDOW;
    /* A bucket from an older second restarts; a race here can lose a few tokens of one
     * second's rate, never the total above. */
    uint64_t sec = __atomic_load_n(&m->rate_sec[b], __ATOMIC_RELAXED);
    if (sec != now &&
        __atomic_compare_exchange_n(&m->rate_sec[b], &sec, now, false, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED))
        __atomic_store_n(&m->rate_tokens[b], 0, __ATOMIC_RELAXED);
    metrics_addu(&m->rate_tokens[b], n);
}

/* --- exposition --------------------------------------------------------------------------------- */

static void met_head(tbuf *b, const char *name, const char *type, const char *help)
{
    tbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static uint64_t met_load(const uint64_t *v)
{
    return __atomic_load_n(v, __ATOMIC_RELAXED);
}

char *metrics_render(gw_metrics *m, const msg_status *st)
{
    tbuf b = {0};
    static const msg_status zero;
    const msg_status *s = st ? st : &zero;

    met_head(&b, "tandem_requests_total", "counter", "HTTP requests by endpoint and status code.");
    for (int ep = 0; ep < MET_EP_COUNT; ep++)
        for (int code = 0; code < MET_STATUS_MAX; code++) {
            uint64_t n = met_load(&m->requests[ep][code]);
            if (n)
                tbuf_printf(&b, "tandem_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                           MET_EP_NAMES[ep], code, (unsigned long long)n);
        }
    met_head(&b, "tandem_prompt_tokens_total", "counter", "Prompt tokens sent to the model.");
    tbuf_printf(&b, "tandem_prompt_tokens_total %llu\n",
               (unsigned long long)met_load(&m->prompt_tokens));
    met_head(&b, "tandem_cached_prompt_tokens_total", "counter",
             "Prompt tokens reused from the prefix cache.");
    tbuf_printf(&b, "tandem_cached_prompt_tokens_total %llu\n",
               (unsigned long long)met_load(&m->cached_tokens));
    met_head(&b, "tandem_generated_tokens_total", "counter", "Tokens generated for clients.");
    tbuf_printf(&b, "tandem_generated_tokens_total %llu\n",
               (unsigned long long)met_load(&m->generated_tokens));
    met_head(&b, "tandem_prediction_tokens_total", "counter",
             "Tokens of requests' predictions, accepted as drafts or not.");
    tbuf_printf(&b, "tandem_prediction_tokens_total{outcome=\"accepted\"} %llu\n",
               (unsigned long long)met_load(&m->prediction_accepted));
    tbuf_printf(&b, "tandem_prediction_tokens_total{outcome=\"rejected\"} %llu\n",
               (unsigned long long)met_load(&m->prediction_rejected));
    met_head(&b, "tandem_tool_calls_total", "counter", "Tool calls returned to clients.");
    tbuf_printf(&b, "tandem_tool_calls_total %llu\n", (unsigned long long)met_load(&m->tool_calls));
    met_head(&b, "tandem_responses_kept", "gauge", "Responses kept for previous_response_id.");
    tbuf_printf(&b, "tandem_responses_kept %llu\n",
               (unsigned long long)met_load(&m->responses_kept));
    met_head(&b, "tandem_responses_kept_bytes", "gauge", "Bytes of the kept responses' JSON.");
    tbuf_printf(&b, "tandem_responses_kept_bytes %llu\n",
               (unsigned long long)met_load(&m->responses_bytes));
    met_head(&b, "tandem_responses_background_running", "gauge",
             "Background responses running.");
    tbuf_printf(&b, "tandem_responses_background_running %llu\n",
               (unsigned long long)met_load(&m->background_running));

    uint64_t now = (uint64_t)time(NULL), recent = 0;
    for (int i = 0; i < MET_RATE_WINDOW; i++) {
        uint64_t sec = met_load(&m->rate_sec[i]);
        if (sec + MET_RATE_WINDOW > now && sec <= now)
            recent += met_load(&m->rate_tokens[i]);
    }
    met_head(&b, "tandem_generated_tokens_per_second", "gauge",
             "Tokens generated per second over the last 10 seconds.");
    tbuf_printf(&b, "tandem_generated_tokens_per_second %.3f\n", (double)recent / MET_RATE_WINDOW);
    met_head(&b, "tandem_generations_total", "counter", "Generations finished.");
    tbuf_printf(&b, "tandem_generations_total %llu\n",
               (unsigned long long)met_load(&m->generations));
    met_head(&b, "tandem_generation_errors_total", "counter", "Generations that failed.");
    tbuf_printf(&b, "tandem_generation_errors_total %llu\n",
               (unsigned long long)met_load(&m->generation_errors));
    met_head(&b, "tandem_generations_cancelled_total", "counter",
             "Generations cancelled because the client disconnected.");
    tbuf_printf(&b, "tandem_generations_cancelled_total %llu\n",
               (unsigned long long)met_load(&m->cancelled));
    met_head(&b, "tandem_requests_running", "gauge", "Generations in progress.");
    tbuf_printf(&b, "tandem_requests_running %lld\n",
               (long long)__atomic_load_n(&m->in_flight, __ATOMIC_RELAXED));
    met_head(&b, "tandem_queue_depth", "gauge",
             "Requests waiting: in the gateway for verifyd to accept them, plus verifyd's queue.");
    tbuf_printf(&b, "tandem_queue_depth %lld\n",
               (long long)__atomic_load_n(&m->waiting, __ATOMIC_RELAXED) + s->queued);

    /* verifyd's numbers */
    met_head(&b, "tandem_verifyd_up", "gauge", "1 when verifyd answers its status calls.");
    tbuf_printf(&b, "tandem_verifyd_up %d\n", st != NULL);
    met_head(&b, "tandem_verifyd_ready", "gauge", "1 when verifyd accepts generations.");
    tbuf_printf(&b, "tandem_verifyd_ready %d\n", s->ready ? 1 : 0);
    met_head(&b, "tandem_draftd_attached", "gauge", "1 when speculative decoding is on.");
    tbuf_printf(&b, "tandem_draftd_attached %d\n", s->draft_attached ? 1 : 0);
    met_head(&b, "tandem_sequences_active", "gauge", "Sequences verifyd is running.");
    tbuf_printf(&b, "tandem_sequences_active %u\n", s->active);
    met_head(&b, "tandem_sequences_queued", "gauge", "Generations waiting in verifyd for a slot.");
    tbuf_printf(&b, "tandem_sequences_queued %u\n", s->queued);
    met_head(&b, "tandem_sequence_slots", "gauge", "Sequences verifyd runs at once.");
    tbuf_printf(&b, "tandem_sequence_slots %u\n", s->slots);

    met_head(&b, "tandem_acceptance_length", "histogram",
             "Tokens committed per target verify pass (speculative decoding acceptance length).");
    uint64_t cum = 0, sum = 0;
    for (uint32_t k = 0; k < s->n_hist && k < MSG_ACCEPT_HIST_MAX; k++) {
        cum += s->accept_hist[k];
        sum += s->accept_hist[k] * k;
        if (k >= 1)
            tbuf_printf(&b, "tandem_acceptance_length_bucket{le=\"%u\"} %llu\n", k,
                       (unsigned long long)cum);
    }
    tbuf_printf(&b, "tandem_acceptance_length_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    tbuf_printf(&b, "tandem_acceptance_length_sum %llu\n", (unsigned long long)sum);
    tbuf_printf(&b, "tandem_acceptance_length_count %llu\n", (unsigned long long)cum);
    met_head(&b, "tandem_draft_tokens_total", "counter", "Draft tokens proposed by draftd.");
    tbuf_printf(&b, "tandem_draft_tokens_total %llu\n", (unsigned long long)s->drafted);
    met_head(&b, "tandem_draft_tokens_accepted_total", "counter", "Draft tokens accepted.");
    tbuf_printf(&b, "tandem_draft_tokens_accepted_total %llu\n", (unsigned long long)s->accepted);
    met_head(&b, "tandem_verify_steps_total", "counter", "Target verify passes while decoding.");
    tbuf_printf(&b, "tandem_verify_steps_total %llu\n", (unsigned long long)s->steps);
    met_head(&b, "tandem_prefill_seconds_total", "counter", "Time in prompt passes.");
    tbuf_printf(&b, "tandem_prefill_seconds_total %.6f\n", (double)s->prefill_us / 1e6);
    met_head(&b, "tandem_draft_seconds_total", "counter", "Time waiting for draftd proposals.");
    tbuf_printf(&b, "tandem_draft_seconds_total %.6f\n", (double)s->draft_us / 1e6);
    met_head(&b, "tandem_verify_seconds_total", "counter", "Time in target verify passes.");
    tbuf_printf(&b, "tandem_verify_seconds_total %.6f\n", (double)s->verify_us / 1e6);
    double decode_s = (double)(s->draft_us + s->verify_us) / 1e6;
    met_head(&b, "tandem_decode_tokens_per_second", "gauge",
             "verifyd's generated tokens per second of draft + verify time since it started.");
    tbuf_printf(&b, "tandem_decode_tokens_per_second %.3f\n",
               decode_s > 0 ? (double)s->completion_tokens / decode_s : 0.0);
    met_head(&b, "tandem_draftd_attaches_total", "counter",
             "Times verifyd found draftd (again): 1 + draftd restarts.");
    tbuf_printf(&b, "tandem_draftd_attaches_total %llu\n", (unsigned long long)s->draft_attaches);
    met_head(&b, "tandem_draftd_restarts_total", "counter",
             "Times draftd came back after the first attach.");
    tbuf_printf(&b, "tandem_draftd_restarts_total %llu\n",
               (unsigned long long)(s->draft_attaches > 0 ? s->draft_attaches - 1 : 0));
    met_head(&b, "tandem_draft_failures_total", "counter",
             "Proposals that failed or came too late (plain decoding for that step).");
    tbuf_printf(&b, "tandem_draft_failures_total %llu\n", (unsigned long long)s->draft_failures);
    met_head(&b, "tandem_graph_recordings_total", "counter",
             "Target forward passes recorded as CUDA graphs (a pass's second run).");
    tbuf_printf(&b, "tandem_graph_recordings_total %llu\n", (unsigned long long)s->graph_recorded);
    met_head(&b, "tandem_graph_replays_total", "counter",
             "Target forward passes run as a replay of a CUDA graph.");
    tbuf_printf(&b, "tandem_graph_replays_total %llu\n", (unsigned long long)s->graph_replayed);
    met_head(&b, "tandem_graph_direct_passes_total", "counter",
             "Target forward passes run op by op where CUDA graphs are on (first runs, passes "
             "that do not repeat, sequences beyond the recordings kept).");
    tbuf_printf(&b, "tandem_graph_direct_passes_total %llu\n", (unsigned long long)s->graph_direct);
    if (b.oom || !b.p) {
        tbuf_free(&b);
        return NULL;
    }
    return b.p;
}
