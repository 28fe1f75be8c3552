/* Placing the target's token embedding and LM head in caller memory (tgt_place_hook, what
 * verifyd does with its shared buffers on a GPU): the hook is asked for exactly those
 * matrices with their file sizes (once for a tied model), the model reads them from that
 * memory and nowhere else (its own arena shrinks by them), the bytes are the file's, and the
 * logits equal those of the same model placed without a hook, bit for bit.
 *
 * The placement path runs for device backends only; here it runs on the CPU's op table
 * marked as a device (host memory, CPU ops), so every byte can be checked without a GPU.
 * test_gpu_pipeline checks the same on the GPU through verifyd's log. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "verifyd/target.h"

#define ALIGN 256 /* bytes: the alignment tgt_place_hook memory must have */

static ops_backend dev; /* the CPU's table with kind OPS_BACKEND_CUDA: placement runs */

/* What the hook was asked and gave. */
typedef struct asked {
    int n;                /* calls */
    char name[2][32];     /* tensor names, in call order */
    size_t bytes[2];      /* sizes asked */
    void *mem[2];         /* memory given, [bytes] each (aligned_alloc) */
    bool give;            /* false: leave every tensor in the arena */
    td_err fail_with;     /* TD_OK, or the error every call returns */
} asked;

static td_err hook_mem(void *ctx, const char *name, size_t bytes, void **out)
{
    asked *a = ctx;
    assert_true(a->n < 2);
    snprintf(a->name[a->n], sizeof a->name[a->n], "%s", name);
    a->bytes[a->n] = bytes;
    if (a->fail_with != TD_OK)
        return err_set(a->fail_with, "no memory for %s here", name);
    if (a->give) {
        a->mem[a->n] = aligned_alloc(ALIGN, (bytes + ALIGN - 1) / ALIGN * ALIGN);
        assert_non_null(a->mem[a->n]);
        *out = a->mem[a->n];
    }
    a->n++;
    return TD_OK;
}

static void asked_free(asked *a)
{
    free(a->mem[0]);
    free(a->mem[1]);
}

static void path_of(char *path, size_t cap, const char *name)
{
    snprintf(path, cap, "tests/data/models/%s.gguf", name);
}

static tgt_model *load(const char *name, const ops_backend *be, asked *a)
{
    char path[256];
    path_of(path, sizeof path, name);
    tgt_model *m = NULL;
    tgt_place_hook hook = {.mem = hook_mem, .ctx = a};
    if (tgt_load_placed(&m, path, be, a ? &hook : NULL) != TD_OK)
        fail_msg("%s: %s", path, err_msg());
    return m;
}

/* Last-token logits of a short prompt: [n_vocab], malloc'd. */
static float *logits_of(const tgt_model *m)
{
    static const int32_t prompt[] = {1, 7, 42, 99, 3, 250};
    const int64_t n = sizeof prompt / sizeof *prompt;
    tgt_state s;
    assert_int_equal(tgt_state_init(&s, m, 64), TD_OK);
    float *lg = malloc((size_t)m->hp.n_vocab * sizeof(float));
    assert_non_null(lg);
    tgt_out out = {.logits = lg, .last_only = true};
    assert_int_equal(tgt_forward(m, &s, prompt, n, false, &out), TD_OK);
    tgt_state_free(&s);
    return lg;
}

static size_t bytes_of(const ops_weight *w)
{
    return (size_t)w->rows * w->row_bytes;
}

static size_t aligned(size_t bytes)
{
    return (bytes + ALIGN - 1) / ALIGN * ALIGN;
}

/* One model: the hook's memory holds the file's bytes of the matrices it was asked for, the
 * model points there, the arena lost exactly them, and the logits are unchanged. */
static void expect_placed(const char *name, bool tied, size_t embd_bytes)
{
    tgt_model *host = load(name, ops_backend_cpu(), NULL); /* the file's mapping */
    tgt_model *plain = load(name, &dev, NULL);
    asked a = {.give = true};
    tgt_model *m = load(name, &dev, &a);

    assert_int_equal(a.n, tied ? 1 : 2);
    assert_string_equal(a.name[0], "token_embd.weight");
    assert_int_equal(a.bytes[0], embd_bytes);
    assert_int_equal(bytes_of(&host->tok_embd), embd_bytes);
    assert_ptr_equal(m->tok_embd.data, a.mem[0]);
    assert_memory_equal(a.mem[0], host->tok_embd.data, embd_bytes);
    size_t out_bytes = 0;
    if (tied) {
        assert_ptr_equal(m->output.data, a.mem[0]);
    } else {
        out_bytes = bytes_of(&host->output);
        assert_string_equal(a.name[1], "output.weight");
        assert_int_equal(a.bytes[1], out_bytes);
        assert_ptr_equal(m->output.data, a.mem[1]);
        assert_memory_equal(a.mem[1], host->output.data, out_bytes);
    }
    assert_int_equal(m->placed_bytes, embd_bytes + out_bytes);
    assert_int_equal(plain->placed_bytes, 0);
    assert_int_equal(m->arena_bytes,
                     plain->arena_bytes - aligned(embd_bytes) - aligned(out_bytes));

    /* the same logits as the arena-only model, bit for bit */
    float *want = logits_of(plain), *got = logits_of(m);
    assert_memory_equal(got, want, (size_t)m->hp.n_vocab * sizeof(float));
    free(want);
    free(got);
    /* read from the hook's memory: zeroing the embedding there changes them */
    memset(a.mem[0], 0, embd_bytes);
    got = logits_of(m);
    bool differs = false;
    want = logits_of(plain);
    for (int64_t i = 0; i < m->hp.n_vocab; i++)
        differs |= got[i] != want[i];
    assert_true(differs);
    free(want);
    free(got);

    tgt_free(m); /* before the memory it reads, as verifyd does */
    asked_free(&a);
    tgt_free(plain);
    tgt_free(host);
}

static void test_place_tied_embedding_asks_once_and_serves_both(void **ctx)
{
    (void)ctx;
    expect_placed("qwen3-tied-q4_k", true, 73728); /* Q4_K [512][256]: 512 * 144 bytes */
}

static void test_place_untied_asks_embedding_then_head(void **ctx)
{
    (void)ctx;
    expect_placed("qwen35-tiny-f32", false, 65536); /* F32 [512][32] */
    expect_placed("qwen3-tiny-f32", false, 131072); /* F32 [512][64] */
}

/* A hook that gives nothing leaves the model as without one. */
static void test_place_hook_giving_nothing_keeps_the_arena(void **ctx)
{
    (void)ctx;
    tgt_model *plain = load("qwen35-tiny-f32", &dev, NULL);
    asked a = {.give = false};
    tgt_model *m = load("qwen35-tiny-f32", &dev, &a);
    assert_int_equal(a.n, 2);
    assert_int_equal(m->placed_bytes, 0);
    assert_int_equal(m->arena_bytes, plain->arena_bytes);
    float *want = logits_of(plain), *got = logits_of(m);
    assert_memory_equal(got, want, (size_t)m->hp.n_vocab * sizeof(float));
    free(want);
    free(got);
    tgt_free(m);
    tgt_free(plain);
}

/* The hook's error ends the load with that error and no model. */
static void test_place_hook_error_fails_the_load(void **ctx)
{
    (void)ctx;
    asked a = {.give = true, .fail_with = TD_ENOMEM};
    tgt_place_hook hook = {.mem = hook_mem, .ctx = &a};
    tgt_model *m = (tgt_model *)&a; /* must be cleared */
    char path[256];
    path_of(path, sizeof path, "qwen35-tiny-f32");
    assert_int_equal(tgt_load_placed(&m, path, &dev, &hook), TD_ENOMEM);
    assert_null(m);
    assert_non_null(strstr(err_msg(), "token_embd.weight"));
    asked_free(&a);
}

/* On the CPU backend the weights stay in the file's mapping and the hook is never asked. */
static void test_place_cpu_backend_never_asks(void **ctx)
{
    (void)ctx;
    tgt_model *host = load("qwen35-tiny-f32", ops_backend_cpu(), NULL);
    asked a = {.give = true};
    tgt_model *m = load("qwen35-tiny-f32", ops_backend_cpu(), &a);
    assert_int_equal(a.n, 0);
    assert_null(m->dev_arena);
    assert_int_equal(m->placed_bytes, 0);
    const gguf_tensor *t = gguf_find_tensor(m->file, "token_embd.weight");
    assert_non_null(t);
    assert_ptr_equal(m->tok_embd.data, t->data);
    tgt_free(m);
    tgt_free(host);
}

int main(void)
{
    dev = *ops_backend_cpu();
    dev.kind = OPS_BACKEND_CUDA;
    dev.name = "host-as-device";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_place_tied_embedding_asks_once_and_serves_both),
        cmocka_unit_test(test_place_untied_asks_embedding_then_head),
        cmocka_unit_test(test_place_hook_giving_nothing_keeps_the_arena),
        cmocka_unit_test(test_place_hook_error_fails_the_load),
        cmocka_unit_test(test_place_cpu_backend_never_asks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
