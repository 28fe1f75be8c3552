/* The profiling wrapper (kernels/backend_prof.h): a backend table whose entries time the
 * wrapped backend's. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/args.h"
#include "kernels/backend_prof.h"
#include "kernels/cuda_mem.h"

#define PF_MAX_PENDING 4096 /* timed calls between two reads of their events (a step has ~1000) */

typedef enum pf_op {
    PF_TO_DEVICE, PF_TO_HOST, PF_COPY, PF_COPY2D, PF_ZERO, PF_MATMUL, PF_GET_ROWS, PF_RMSNORM,
    PF_L2NORM, PF_ADD, PF_MUL, PF_SCALE, PF_SILU, PF_SIGMOID, PF_SOFTPLUS, PF_SWIGLU,
    PF_ROPE_NEOX, PF_ATTENTION, PF_CONV1D, PF_DELTA_RULE, PF_SOFTCAP, PF_ARGMAX,
    PF_ACCEPT_GREEDY, PF_ADD_RMSNORM, PF_DELTANET_IN, PF_TO_F16, PF_TO_BF16, PF_FROM_BF16,
    PF_MATMUL_MULTI, PF_ACCEPT_SAMPLED, PF_SWIGLU_MATMUL,
    PF_QK_NORM_ROPE, PF_DELTA_RULE_MANY, PF_SAMPLE_ROWS, PF_LOGPROB_ROWS, PF_LOGIT_ADD,
    PF_LOGIT_MASK, PF_N_OPS
} pf_op;

static const char *const pf_names[PF_N_OPS] = {
    "to_device", "to_host", "copy", "copy2d", "zero", "matmul", "get_rows", "rmsnorm", "l2norm",
    "add", "mul", "scale", "silu", "sigmoid", "softplus", "swiglu", "rope_neox", "attention",
    "conv1d_causal", "delta_rule", "softcap", "argmax", "accept_greedy", "add_rmsnorm",
    "deltanet_in", "to_f16", "to_bf16", "from_bf16", "matmul_multi", "accept_sampled",
    "swiglu_matmul", "qk_norm_rope", "delta_rule_many", "sample_rows", "logprob_rows",
    "logit_add", "logit_mask",
};

typedef struct pf_stat {
    uint64_t calls, launches;
    double dev_us, host_us;
} pf_stat;

#ifdef TANDEM_HAVE_CUDA
typedef struct pf_pending {
    pf_op op;
    cuda_event begin, end; /* created on first use of the slot, reused afterwards */
} pf_pending;
#endif

typedef struct ops_prof {
    ops_backend pub;          /* the table callers hold */
    const ops_backend *inner; /* the backend that does the work */
    bool on;                  /* timing and counting (false: pass through) */
    bool device;              /* device time from CUDA events */
    bool skip[PF_N_OPS];      /* ops whose calls return at once (ops_prof_skip) */
    pf_stat stat[PF_N_OPS];
    uint64_t steps;           /* ops_prof_step marks since the reset */
    uint64_t lost;            /* calls whose device time could not be read */
#ifdef TANDEM_HAVE_CUDA
    pf_pending *pend;         /* [PF_MAX_PENDING] */
    int n_pend;               /* calls timed whose events are not read yet */
    int n_made;               /* slots whose events exist */
#endif
} ops_prof;

/* One call in flight. */
typedef struct pf_mark {
    bool live;
    pf_op op;
    double t0;     /* host seconds at the start */
    uint64_t l0;   /* launch count at the start */
    int slot;      /* pending slot, -1 when the device time is not taken */
} pf_mark;

static double pf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t pf_launches(const ops_prof *p)
{
#ifdef TANDEM_HAVE_CUDA
    if (p->device)
        return cuda_launch_count();
#endif
    (void)p;
    return 0;
}

/* Reads the device times of every pending call; their work must have completed. */
static void pf_harvest(ops_prof *p)
{
#ifdef TANDEM_HAVE_CUDA
    for (int i = 0; i < p->n_pend; i++) {
        double us = 0;
        if (cuda_event_elapsed_us(&us, p->pend[i].begin, p->pend[i].end) == TD_OK)
            p->stat[p->pend[i].op].dev_us += us;
        else
            p->lost++;
    }
    p->n_pend = 0;
    err_clear(); /* a lost time is counted, not an error of the caller's call */
#else
    (void)p;
#endif
}

#ifdef TANDEM_HAVE_CUDA
/* A pending slot whose begin event is recorded, or -1. Full: waits for the last call. */
static int pf_slot(ops_prof *p)
{
    if (p->n_pend == PF_MAX_PENDING) {
        if (cuda_event_wait(p->pend[p->n_pend - 1].end) != TD_OK) {
            p->lost += (uint64_t)p->n_pend;
            p->n_pend = 0;
        }
        pf_harvest(p);
    }
    int i = p->n_pend;
    if (i == p->n_made) {
        if (cuda_event_create(&p->pend[i].begin) != TD_OK)
            return -1;
        if (cuda_event_create(&p->pend[i].end) != TD_OK) {
            cuda_event_free(p->pend[i].begin);
            return -1;
        }
        p->n_made++;
    }
    if (cuda_event_record(p->pend[i].begin, p->inner->stream) != TD_OK)
        return -1;
    return i;
}
#endif

static void pf_begin(const ops_backend *be, pf_op op, pf_mark *m)
{
    ops_prof *p = be->prof;
    m->live = p->on;
    if (!m->live)
        return;
    m->op = op;
    m->slot = -1;
#ifdef TANDEM_HAVE_CUDA
    if (p->device) {
        m->slot = pf_slot(p);
        if (m->slot < 0)
            err_clear();
    }
#endif
    m->l0 = pf_launches(p);
    m->t0 = pf_now();
}

/* e: the call's result; after a failure nothing is recorded, so the call's error message
 * stays. */
static void pf_end(const ops_backend *be, pf_mark *m, td_err e)
{
    ops_prof *p = be->prof;
    if (!m->live)
        return;
    double host = (pf_now() - m->t0) * 1e6;
    pf_stat *s = &p->stat[m->op];
    s->calls++;
    s->host_us += host;
    s->launches += pf_launches(p) - m->l0;
    if (e != TD_OK) {
        p->lost++;
        return;
    }
    if (!p->device) {
        s->dev_us += host;
        return;
    }
#ifdef TANDEM_HAVE_CUDA
    if (m->slot >= 0 && cuda_event_record(p->pend[m->slot].end, p->inner->stream) == TD_OK) {
        p->pend[m->slot].op = m->op;
        p->n_pend++;
        return;
    }
    err_clear();
#endif
    p->lost++;
}

/* --- the wrapped table ----------------------------------------------------------------- */

#define PF_IN(be) ((be)->prof->inner)

/* Runs call (an expression using `in`, the inner backend) as op. */
#define PF_TIMED(op, call)                                                                   \
    do {                                                                                     \
        const ops_backend *in = PF_IN(be);                                                   \
        if (be->prof->skip[op])                                                              \
            return TD_OK;                                                                    \
        pf_mark pf_m_;                                                                       \
        pf_begin(be, op, &pf_m_);                                                            \
        td_err pf_e_ = (call);                                                               \
        pf_end(be, &pf_m_, pf_e_);                                                           \
        return pf_e_;                                                                        \
    } while (0)

static td_err pf_alloc(const ops_backend *be, void **p, size_t bytes)
{
    return PF_IN(be)->alloc(PF_IN(be), p, bytes);
}

static void pf_release(const ops_backend *be, void *p)
{
    PF_IN(be)->release(PF_IN(be), p);
}

static td_err pf_to_device(const ops_backend *be, void *dst, const void *src, size_t bytes)
{
    PF_TIMED(PF_TO_DEVICE, in->to_device(in, dst, src, bytes));
}

static td_err pf_to_host(const ops_backend *be, void *dst, const void *src, size_t bytes)
{
    const ops_backend *in = PF_IN(be);
    pf_mark m;
    pf_begin(be, PF_TO_HOST, &m);
    td_err e = in->to_host(in, dst, src, bytes);
    pf_end(be, &m, e);
    /* the download waited for the stream: every pending event has completed */
    if (e == TD_OK && m.live)
        pf_harvest(be->prof);
    return e;
}

static td_err pf_copy(const ops_backend *be, void *dst, const void *src, size_t bytes)
{
    PF_TIMED(PF_COPY, in->copy(in, dst, src, bytes));
}

static td_err pf_copy2d(const ops_backend *be, void *dst, size_t dpitch, const void *src,
                        size_t spitch, size_t width, size_t rows)
{
    PF_TIMED(PF_COPY2D, in->copy2d(in, dst, dpitch, src, spitch, width, rows));
}

static td_err pf_zero(const ops_backend *be, void *p, size_t bytes)
{
    PF_TIMED(PF_ZERO, in->zero(in, p, bytes));
}

static td_err pf_sync(const ops_backend *be)
{
    td_err e = PF_IN(be)->sync(PF_IN(be));
    if (e == TD_OK)
        pf_harvest(be->prof);
    return e;
}

static td_err pf_matmul(const ops_backend *be, float *y, const float *x, const ops_weight *w,
                        int64_t n_tok)
{
    PF_TIMED(PF_MATMUL, in->matmul(in, y, x, w, n_tok));
}

static td_err pf_matmul_multi(const ops_backend *be, const float *x, const ops_mm_out *mm, int n,
                              int64_t n_tok)
{
    PF_TIMED(PF_MATMUL_MULTI, in->matmul_multi(in, x, mm, n, n_tok));
}

static td_err pf_get_rows(const ops_backend *be, float *out, const ops_weight *w,
                          const int32_t *ids, int64_t n)
{
    PF_TIMED(PF_GET_ROWS, in->get_rows(in, out, w, ids, n));
}

static td_err pf_rmsnorm(const ops_backend *be, float *out, const float *x, const float *w,
                         int64_t n_rows, int64_t dim, int64_t stride, float eps)
{
    PF_TIMED(PF_RMSNORM, in->rmsnorm(in, out, x, w, n_rows, dim, stride, eps));
}

static td_err pf_l2norm(const ops_backend *be, float *out, const float *x, int64_t n_rows,
                        int64_t dim, int64_t stride, float eps)
{
    PF_TIMED(PF_L2NORM, in->l2norm(in, out, x, n_rows, dim, stride, eps));
}

#define PF_BINARY(name, op)                                                                  \
    static td_err pf_##name(const ops_backend *be, float *out, const float *a, const float *b, \
                            int64_t n)                                                       \
    {                                                                                        \
        PF_TIMED(op, in->name(in, out, a, b, n));                                            \
    }
#define PF_UNARY(name, op)                                                                   \
    static td_err pf_##name(const ops_backend *be, float *out, const float *x, int64_t n)    \
    {                                                                                        \
        PF_TIMED(op, in->name(in, out, x, n));                                               \
    }
PF_BINARY(add, PF_ADD)
PF_BINARY(mul, PF_MUL)
PF_BINARY(swiglu, PF_SWIGLU)
PF_UNARY(silu, PF_SILU)
PF_UNARY(sigmoid, PF_SIGMOID)
PF_UNARY(softplus, PF_SOFTPLUS)

static td_err pf_scale(const ops_backend *be, float *out, const float *x, float s, int64_t n)
{
    PF_TIMED(PF_SCALE, in->scale(in, out, x, s, n));
}

static td_err pf_rope_neox(const ops_backend *be, float *x, int64_t n_tok, int64_t n_head,
                           int64_t tok_stride, int64_t head_stride, int64_t n_rot,
                           const int32_t *pos, float theta)
{
    PF_TIMED(PF_ROPE_NEOX,
             in->rope_neox(in, x, n_tok, n_head, tok_stride, head_stride, n_rot, pos, theta));
}

static td_err pf_attention(const ops_backend *be, const ops_attn *a)
{
    PF_TIMED(PF_ATTENTION, in->attention(in, a));
}

static td_err pf_conv1d_causal(const ops_backend *be, float *out, float *state, float *state_all,
                               const float *x, int64_t x_stride, const float *w, int64_t n_tok,
                               int64_t n_ch, int64_t k)
{
    PF_TIMED(PF_CONV1D,
             in->conv1d_causal(in, out, state, state_all, x, x_stride, w, n_tok, n_ch, k));
}

static td_err pf_swiglu_matmul(const ops_backend *be, float *y, float *gate, const float *up,
                               const ops_weight *w, int64_t n_tok)
{
    PF_TIMED(PF_SWIGLU_MATMUL, in->swiglu_matmul(in, y, gate, up, w, n_tok));
}

static td_err pf_qk_norm_rope(const ops_backend *be, float *q, float *k, const float *q_norm,
                              const float *k_norm, int64_t n_tok, int64_t n_head,
                              int64_t n_head_kv, int64_t head_dim, int64_t q_head, int64_t n_rot,
                              const int32_t *pos, float theta, float eps, const ops_kv_dst *kv)
{
    PF_TIMED(PF_QK_NORM_ROPE, in->qk_norm_rope(in, q, k, q_norm, k_norm, n_tok, n_head, n_head_kv,
                                               head_dim, q_head, n_rot, pos, theta, eps, kv));
}

static td_err pf_delta_rule(const ops_backend *be, const ops_delta *d)
{
    PF_TIMED(PF_DELTA_RULE, in->delta_rule(in, d));
}

static td_err pf_delta_rule_many(const ops_backend *be, const ops_delta *d, int64_t n)
{
    PF_TIMED(PF_DELTA_RULE_MANY, in->delta_rule_many(in, d, n));
}

static td_err pf_to_f16(const ops_backend *be, uint16_t *out, const float *x, int64_t n)
{
    PF_TIMED(PF_TO_F16, in->to_f16(in, out, x, n));
}

static td_err pf_to_bf16(const ops_backend *be, uint16_t *out, const float *x, int64_t n)
{
    PF_TIMED(PF_TO_BF16, in->to_bf16(in, out, x, n));
}

static td_err pf_from_bf16(const ops_backend *be, float *out, const uint16_t *x, int64_t n)
{
    PF_TIMED(PF_FROM_BF16, in->from_bf16(in, out, x, n));
}

static td_err pf_add_rmsnorm(const ops_backend *be, float *x, const float *h, float *out,
                             const float *w, int64_t n_rows, int64_t dim, float eps)
{
    PF_TIMED(PF_ADD_RMSNORM, in->add_rmsnorm(in, x, h, out, w, n_rows, dim, eps));
}

static td_err pf_deltanet_in(const ops_backend *be, const ops_dn_in *p)
{
    PF_TIMED(PF_DELTANET_IN, in->deltanet_in(in, p));
}

static td_err pf_softcap(const ops_backend *be, float *out, const float *x, float cap, int64_t n)
{
    PF_TIMED(PF_SOFTCAP, in->softcap(in, out, x, cap, n));
}

static td_err pf_argmax(const ops_backend *be, int32_t *idx, const float *x, int64_t n_rows,
                        int64_t n)
{
    PF_TIMED(PF_ARGMAX, in->argmax(in, idx, x, n_rows, n));
}

static td_err pf_accept_greedy(const ops_backend *be, int32_t *argmax, int32_t *result,
                               const float *logits, const int32_t *draft, int64_t n,
                               int64_t n_vocab)
{
    PF_TIMED(PF_ACCEPT_GREEDY,
             in->accept_greedy(in, argmax, result, logits, draft, n, n_vocab));
}

static td_err pf_sample_rows(const ops_backend *be, int32_t *tok, float *q, const float *logits,
                             int64_t n, int64_t n_vocab, const ops_sampler *s, uint64_t ctr,
                             uint64_t ctr_step)
{
    PF_TIMED(PF_SAMPLE_ROWS, in->sample_rows(in, tok, q, logits, n, n_vocab, s, ctr, ctr_step));
}

static td_err pf_accept_sampled(const ops_backend *be, int32_t *result, float *p,
                                const float *logits, const float *q, const int32_t *draft,
                                int64_t n, int64_t n_vocab, const ops_sampler *s,
                                const ops_accept_rng *rng)
{
    PF_TIMED(PF_ACCEPT_SAMPLED,
             in->accept_sampled(in, result, p, logits, q, draft, n, n_vocab, s, rng));
}

static td_err pf_logit_add(const ops_backend *be, float *logits, int64_t n, int64_t n_vocab,
                           const int32_t *off, const ops_logit_add *add)
{
    PF_TIMED(PF_LOGIT_ADD, in->logit_add(in, logits, n, n_vocab, off, add));
}

static td_err pf_logit_mask(const ops_backend *be, float *logits, int64_t n, int64_t n_vocab,
                            const uint32_t *allow)
{
    PF_TIMED(PF_LOGIT_MASK, in->logit_mask(in, logits, n, n_vocab, allow));
}

static td_err pf_logprob_rows(const ops_backend *be, ops_logprob *out, const float *logits,
                              const int32_t *tok, int64_t n, int64_t n_vocab, int n_top)
{
    PF_TIMED(PF_LOGPROB_ROWS, in->logprob_rows(in, out, logits, tok, n, n_vocab, n_top));
}

static td_err pf_graph_begin(const ops_backend *be)
{
    return PF_IN(be)->graph_begin(PF_IN(be));
}

static td_err pf_graph_end(const ops_backend *be, void **graph)
{
    return PF_IN(be)->graph_end(PF_IN(be), graph);
}

static td_err pf_graph_launch(const ops_backend *be, void *graph)
{
    return PF_IN(be)->graph_launch(PF_IN(be), graph);
}

static void pf_graph_free(const ops_backend *be, void *graph)
{
    PF_IN(be)->graph_free(PF_IN(be), graph);
}

/* --- public ------------------------------------------------------------------------------- */

bool ops_prof_wanted(void)
{
    const char *v = getenv("TANDEM_PROFILE");
    return v && *v && strcmp(v, "0") != 0;
}

td_err ops_prof_wrap(ops_backend **out, const ops_backend *inner)
{
    *out = NULL;
    TD_ASSERT(inner != NULL && inner->prof == NULL);
    ops_prof *p = calloc(1, sizeof *p);
    if (!p)
        return err_set(TD_ENOMEM, "out of memory for the profiler");
    p->inner = inner;
    p->on = true;
    p->device = inner->kind == OPS_BACKEND_CUDA;
#ifdef TANDEM_HAVE_CUDA
    p->pend = calloc(PF_MAX_PENDING, sizeof *p->pend);
    if (!p->pend) {
        free(p);
        return err_set(TD_ENOMEM, "out of memory for the profiler");
    }
#endif
    ops_backend *b = &p->pub;
    *b = *inner; /* kind, name, stream, device */
    b->prof = p;
    b->alloc = pf_alloc;
    b->release = pf_release;
    b->to_device = pf_to_device;
    b->to_host = pf_to_host;
    b->copy = pf_copy;
    b->copy2d = pf_copy2d;
    b->zero = pf_zero;
    b->sync = pf_sync;
    b->matmul = pf_matmul;
    b->matmul_multi = pf_matmul_multi;
    b->get_rows = pf_get_rows;
    b->rmsnorm = pf_rmsnorm;
    b->l2norm = pf_l2norm;
    b->add = pf_add;
    b->mul = pf_mul;
    b->scale = pf_scale;
    b->silu = pf_silu;
    b->sigmoid = pf_sigmoid;
    b->softplus = pf_softplus;
    b->swiglu = pf_swiglu;
    b->rope_neox = pf_rope_neox;
    b->attention = pf_attention;
    b->conv1d_causal = pf_conv1d_causal;
    b->swiglu_matmul = pf_swiglu_matmul;
    b->qk_norm_rope = pf_qk_norm_rope;
    b->delta_rule = pf_delta_rule;
    b->delta_rule_many = pf_delta_rule_many;
    b->to_f16 = pf_to_f16;
    b->to_bf16 = pf_to_bf16;
    b->from_bf16 = pf_from_bf16;
    b->add_rmsnorm = pf_add_rmsnorm;
    b->deltanet_in = pf_deltanet_in;
    b->softcap = pf_softcap;
    b->argmax = pf_argmax;
    b->accept_greedy = pf_accept_greedy;
    b->sample_rows = pf_sample_rows;
    b->accept_sampled = pf_accept_sampled;
    b->logprob_rows = pf_logprob_rows;
    b->logit_add = pf_logit_add;
    b->logit_mask = pf_logit_mask;
    /* graphs pass through; callers do not record or replay while profiling is on
     * (ops_prof_on), since a replay would hide the ops and a recording would hold events */
    b->graph_begin = inner->graph_begin ? pf_graph_begin : NULL;
    b->graph_end = inner->graph_end ? pf_graph_end : NULL;
    b->graph_launch = inner->graph_launch ? pf_graph_launch : NULL;
    b->graph_free = inner->graph_free ? pf_graph_free : NULL;
    *out = b;
    return TD_OK;
}

td_err ops_prof_skip(const ops_backend *be, const char *list)
{
    ops_prof *p = be->prof;
    TD_ASSERT(p != NULL && list != NULL);
    _Static_assert(PF_N_OPS <= 64, "the op names fit a mask");
    uint64_t mask = 0;
    TD_TRY(args_names(list, pf_names, PF_N_OPS, &mask, "op", "to skip: the profile table's names"));
    bool skip[PF_N_OPS] = {false};
    for (int op = 0; op < PF_N_OPS; op++) {
        if (!(mask >> op & 1))
            continue;
        /* the data movement is what the caller's host side relies on */
        if (op == PF_TO_DEVICE || op == PF_TO_HOST || op == PF_COPY || op == PF_COPY2D ||
            op == PF_ZERO || op == PF_TO_BF16 || op == PF_FROM_BF16)
            return err_set(TD_EINVAL, "'%s' moves data and cannot be skipped", pf_names[op]);
        skip[op] = true;
    }
    memcpy(p->skip, skip, sizeof skip);
    return TD_OK;
}

bool ops_prof_skipping(const ops_backend *be)
{
    for (int i = 0; be->prof && i < PF_N_OPS; i++)
        if (be->prof->skip[i])
            return true;
    return false;
}

const ops_backend *ops_prof_inner(const ops_backend *be)
{
    return be->prof ? be->prof->inner : be;
}

void ops_prof_free(ops_backend *be)
{
    if (!be)
        return;
    ops_prof *p = be->prof;
    TD_ASSERT(p != NULL && be == &p->pub);
#ifdef TANDEM_HAVE_CUDA
    if (p->n_pend)
        (void)p->inner->sync(p->inner); /* no event is destroyed while queued */
    for (int i = 0; i < p->n_made; i++) {
        cuda_event_free(p->pend[i].begin);
        cuda_event_free(p->pend[i].end);
    }
    free(p->pend);
#endif
    free(p);
}

bool ops_prof_active(const ops_backend *be)
{
    return be->prof != NULL;
}

bool ops_prof_on(const ops_backend *be)
{
    return be->prof != NULL && be->prof->on;
}

void ops_prof_enable(const ops_backend *be, bool on)
{
    if (be->prof)
        be->prof->on = on;
}

void ops_prof_reset(const ops_backend *be)
{
    ops_prof *p = be->prof;
    if (!p)
        return;
    memset(p->stat, 0, sizeof p->stat);
    p->steps = 0;
    p->lost = 0;
#ifdef TANDEM_HAVE_CUDA
    p->n_pend = 0; /* a slot's events are simply recorded again */
#endif
}

void ops_prof_step(const ops_backend *be)
{
    if (be->prof && be->prof->on)
        be->prof->steps++;
}

static int pf_row_cmp(const void *a, const void *b)
{
    const ops_prof_row *x = a, *y = b;
    return x->dev_us < y->dev_us ? 1 : x->dev_us > y->dev_us ? -1 : strcmp(x->op, y->op);
}

td_err ops_prof_snapshot(const ops_backend *be, ops_prof_table *t)
{
    memset(t, 0, sizeof *t);
    ops_prof *p = be->prof;
    if (!p)
        return TD_OK;
#ifdef TANDEM_HAVE_CUDA
    if (p->n_pend)
        TD_TRY(p->inner->sync(p->inner));
#endif
    pf_harvest(p);
    t->steps = p->steps;
    t->device_timed = p->device;
    t->lost = p->lost;
    for (int i = 0; i < PF_N_OPS; i++) {
        if (!p->stat[i].calls)
            continue;
        ops_prof_row *r = &t->rows[t->n_rows++];
        r->op = pf_names[i];
        r->calls = p->stat[i].calls;
        r->launches = p->stat[i].launches;
        r->dev_us = p->stat[i].dev_us;
        r->host_us = p->stat[i].host_us;
    }
    qsort(t->rows, (size_t)t->n_rows, sizeof t->rows[0], pf_row_cmp);
    return TD_OK;
}

void ops_prof_print(FILE *f, const char *title, const ops_prof_table *t, double wall_ms)
{
    double per = t->steps ? 1.0 / (double)t->steps : 1.0;
    double dev = 0, host = 0;
    uint64_t calls = 0, launches = 0;
    for (int i = 0; i < t->n_rows; i++) {
        dev += t->rows[i].dev_us;
        host += t->rows[i].host_us;
        calls += t->rows[i].calls;
        launches += t->rows[i].launches;
    }
    fprintf(f, "%s: %s, %s\n", title,
            t->steps ? "per step" : "totals",
            t->device_timed ? "device time from CUDA events" : "host clock (CPU backend)");
    if (t->steps)
        fprintf(f, "  (%llu steps)\n", (unsigned long long)t->steps);
    fprintf(f, "  %-16s %10s %10s %12s %7s %12s\n", "op", "calls", "launches", "device us",
            "share", "host us");
    for (int i = 0; i < t->n_rows; i++) {
        const ops_prof_row *r = &t->rows[i];
        fprintf(f, "  %-16s %10.1f %10.1f %12.1f %6.1f%% %12.1f\n", r->op, (double)r->calls * per,
                (double)r->launches * per, r->dev_us * per, dev > 0 ? 100 * r->dev_us / dev : 0.0,
                r->host_us * per);
    }
    fprintf(f, "  %-16s %10.1f %10.1f %12.1f %6.1f%% %12.1f\n", "total", (double)calls * per,
            (double)launches * per, dev * per, dev > 0 ? 100.0 : 0.0, host * per);
    if (wall_ms > 0 && t->steps)
        fprintf(f, "  wall %.3f ms per step: device busy in ops %.3f ms (%.1f%%), idle %.3f ms "
                "(launch gaps, host work, syncs)\n", wall_ms, dev * per * 1e-3,
                100 * dev * per * 1e-3 / wall_ms, wall_ms - dev * per * 1e-3);
    if (t->lost)
        fprintf(f, "  %llu calls have no device time (an event failed)\n",
                (unsigned long long)t->lost);
}
