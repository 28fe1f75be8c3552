/* GGUF open time: how long parsing and validating the metadata takes. A real Qwen3.5 vocab is
 * two string arrays of about 248k entries each (tokens, merges), which dominates.
 *
 *   bench_gguf            a synthetic image with a 248320-token vocab and 247556 merges
 *   bench_gguf FILE...    each file through gguf_open (mmap) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/gguf.h"

#define BENCH_REPS 20

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint8_t *bench_vocab_image(uint64_t *size)
{
    enum { N_TOKENS = 248320, N_MERGES = 247556 };
    char (*tok)[24] = malloc((size_t)N_TOKENS * sizeof *tok);
    const char **ptr = malloc((size_t)N_TOKENS * sizeof *ptr);
    int32_t *types = malloc((size_t)N_TOKENS * sizeof *types);
    TD_ASSERT(tok && ptr && types);
    gguf_writer *w = gguf_writer_new();
    TD_ASSERT(w);
    for (int i = 0; i < N_TOKENS; i++) {
        snprintf(tok[i], sizeof tok[i], "\xc4\xa0tok%d", i);
        ptr[i] = tok[i];
        types[i] = 1;
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", ptr, N_TOKENS);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, N_TOKENS);
    for (int i = 0; i < N_MERGES; i++)
        snprintf(tok[i], sizeof tok[i], "m%d x%d", i, i % 97);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", ptr, N_MERGES);
    uint8_t *image;
    TD_ASSERT(gguf_writer_write_mem(w, &image, size) == TD_OK);
    gguf_writer_free(w);
    free(tok);
    free(ptr);
    free(types);
    return image;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        uint64_t size;
        uint8_t *image = bench_vocab_image(&size);
        double t0 = bench_now();
        for (int r = 0; r < BENCH_REPS; r++) {
            gguf_file *g;
            TD_ASSERT(gguf_open_memory(&g, image, size) == TD_OK);
            gguf_close(g);
        }
        double ms = (bench_now() - t0) * 1e3 / BENCH_REPS;
        printf("synthetic vocab image: %.1f MB, open %.2f ms (%.0f MB/s)\n", (double)size / 1e6, ms,
               (double)size / 1e3 / ms);
        free(image);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        double t0 = bench_now();
        gguf_file *g = NULL;
        for (int r = 0; r < BENCH_REPS; r++) {
            gguf_close(g);
            g = NULL;
            if (gguf_open(&g, argv[i]) != TD_OK) {
                fprintf(stderr, "bench_gguf: %s\n", err_msg());
                return 1;
            }
        }
        double ms = (bench_now() - t0) * 1e3 / BENCH_REPS;
        printf("%s: %llu keys, %llu tensors, data at %llu bytes: open %.2f ms\n", argv[i],
               (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors,
               (unsigned long long)g->data_offset, ms);
        gguf_close(g);
    }
    return 0;
}
