/* Fuzz target: gguf_open_memory on arbitrary bytes, then every key, value, array element and
 * tensor through the public accessors; a file that opens is written again with the writer and
 * must read back with the same counts. Invariants are TD_ASSERTs, so a broken one is a crash
 * the fuzzer reports; over-reads are caught by the sanitizers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"

static volatile uint8_t fuzz_sink; /* keeps the reads below from being optimised away */

static void fuzz_touch_bytes(const void *p, uint64_t n)
{
    if (n) {
        fuzz_sink ^= ((const uint8_t *)p)[0];
        fuzz_sink ^= ((const uint8_t *)p)[n - 1];
    }
}

static void fuzz_touch_value(const gguf_value *v, int depth)
{
    TD_ASSERT(depth <= GGUF_MAX_NESTING);
    if (v->type == GGUF_TYPE_STRING) {
        fuzz_touch_bytes(v->str.ptr, v->str.len);
        return;
    }
    if (v->type != GGUF_TYPE_ARRAY)
        return;
    TD_ASSERT(depth < GGUF_MAX_NESTING);
    for (uint64_t i = 0; i < v->arr.n; i++) {
        gguf_value e;
        TD_ASSERT(gguf_arr_get(v, i, &e) == TD_OK);
        TD_ASSERT(e.type == v->arr.elem);
        int64_t x;
        double d;
        gguf_str s;
        td_err ei = gguf_arr_i64(v, i, &x);
        td_err ef = gguf_arr_f64(v, i, &d);
        td_err es = gguf_arr_str(v, i, &s);
        TD_ASSERT((es == TD_OK) == (v->arr.elem == GGUF_TYPE_STRING));
        if (v->arr.elem == GGUF_TYPE_STRING || v->arr.elem == GGUF_TYPE_ARRAY)
            TD_ASSERT(ei != TD_OK && ef != TD_OK);
        fuzz_touch_value(&e, depth + 1);
    }
    int64_t x;
    TD_ASSERT(gguf_arr_i64(v, v->arr.n, &x) != TD_OK);
}

/* Writes g again and checks that the copy opens with the same shape. */
static void fuzz_rewrite(const gguf_file *g)
{
    gguf_writer *w = gguf_writer_new();
    if (!w)
        return;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        if (memchr(kv->key.ptr, 0, kv->key.len)) {
            gguf_writer_free(w);
            return; /* a C-string key cannot say it */
        }
        char *key = strndup(kv->key.ptr, kv->key.len);
        if (!key) {
            gguf_writer_free(w);
            return;
        }
        gguf_writer_set_value(w, key, &kv->value);
        free(key);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        TD_ASSERT(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size) == TD_OK);
    }
    uint8_t *image;
    uint64_t size;
    if (gguf_writer_write_mem(w, &image, &size) == TD_OK) {
        gguf_file *h = NULL;
        TD_ASSERT(gguf_open_memory(&h, image, size) == TD_OK);
        TD_ASSERT(h->n_kv == g->n_kv && h->n_tensors == g->n_tensors);
        for (uint64_t i = 0; i < g->n_tensors; i++)
            TD_ASSERT(memcmp(h->tensors[i].data, g->tensors[i].data, g->tensors[i].size) == 0);
        gguf_close(h);
        free(image);
    }
    gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *g = (gguf_file *)&fuzz_sink;
    if (gguf_open_memory(&g, data, size) != TD_OK) {
        TD_ASSERT(g == NULL && err_msg()[0] != '\0');
        return 0;
    }
    TD_ASSERT(g->version == 2 || g->version == 3);
    TD_ASSERT(g->alignment && (g->alignment & (g->alignment - 1)) == 0);
    TD_ASSERT(g->data_offset % g->alignment == 0);
    char key[512];
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        TD_ASSERT(kv->key.len > 0);
        fuzz_touch_value(&kv->value, 0);
        if (kv->key.len >= sizeof key || memchr(kv->key.ptr, 0, kv->key.len))
            continue;
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = '\0';
        TD_ASSERT(gguf_get(g, key) == &kv->value);
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f;
        bool b;
        gguf_str s;
        const gguf_value *a;
        (void)gguf_get_u32(g, key, &u32);
        (void)gguf_get_u64(g, key, &u64);
        (void)gguf_get_i64(g, key, &i64);
        (void)gguf_get_f32(g, key, &f);
        (void)gguf_get_bool(g, key, &b);
        TD_ASSERT((gguf_get_str(g, key, &s) == TD_OK) == (kv->value.type == GGUF_TYPE_STRING));
        TD_ASSERT((gguf_get_arr(g, key, &a) == TD_OK) == (kv->value.type == GGUF_TYPE_ARRAY));
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        TD_ASSERT(gguf_find_tensor(g, t->name) == t);
        TD_ASSERT(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
        TD_ASSERT(t->offset % g->alignment == 0);
        const uint8_t *p = t->data;
        TD_ASSERT(p >= g->base + g->data_offset && t->size <= g->size &&
                  (uint64_t)(p - g->base) <= g->size - t->size);
        fuzz_touch_bytes(p, t->size);
    }
    fuzz_rewrite(g);
    gguf_close(g);
    return 0;
}
