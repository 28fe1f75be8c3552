/* bench_tokenizer: what the tokenizer costs.
 * Prints the time to load a GGUF file's tokenizer (open, tables, regex JIT), then encode and
 * decode throughput over a text file: MB/s and tokens/s, the first pass (cold word cache) and
 * the best of the following passes.
 * Usage: bench_tokenizer MODEL.gguf [TEXT_FILE] [passes] (defaults: the tokenizer test corpus,
 * 5 passes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/tokenizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = buf ? (size_t)n : 0;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_tokenizer MODEL.gguf [TEXT_FILE] [passes]\n");
        return 2;
    }
    const char *text_path = argc > 2 ? argv[2] : "tests/data/tokenizer_corpus.txt";
    int passes = argc > 3 ? atoi(argv[3]) : 5;
    if (passes < 1)
        passes = 1;

    double t0 = now_s();
    tokenizer *t = NULL;
    if (tok_open(&t, argv[1]) != TD_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", err_msg());
        return 1;
    }
    printf("load: %.1f ms (%u tokens)\n", (now_s() - t0) * 1e3, tok_n_vocab(t));

    size_t len;
    char *text = read_all(text_path, &len);
    if (!text) {
        fprintf(stderr, "bench_tokenizer: cannot read %s\n", text_path);
        tok_free(t);
        return 1;
    }
    tok_ids ids = {0};
    tok_bytes out = {0};
    double first = 0, best = 1e30, dec_best = 1e30;
    for (int p = 0; p < passes; p++) {
        ids.n = 0;
        double a = now_s();
        if (tok_encode(t, text, len, 0, &ids) != TD_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", err_msg());
            break;
        }
        double d = now_s() - a;
        if (p == 0)
            first = d;
        else if (d < best)
            best = d;
        out.len = 0;
        a = now_s();
        if (tok_decode(t, ids.ids, ids.n, 0, &out) != TD_OK) {
            fprintf(stderr, "bench_tokenizer: %s\n", err_msg());
            break;
        }
        d = now_s() - a;
        if (d < dec_best)
            dec_best = d;
    }
    if (passes == 1)
        best = first;
    double mb = (double)len / 1e6;
    printf("text: %s, %zu bytes, %zu tokens\n", text_path, len, ids.n);
    printf("encode, first pass: %.1f MB/s, %.0f tokens/s\n", mb / first, (double)ids.n / first);
    printf("encode, best pass:  %.1f MB/s, %.0f tokens/s\n", mb / best, (double)ids.n / best);
    printf("decode, best pass:  %.1f MB/s, %.0f tokens/s\n", mb / dec_best, (double)ids.n / dec_best);
    tok_ids_free(&ids);
    tok_bytes_free(&out);
    free(text);
    tok_free(t);
    return 0;
}
