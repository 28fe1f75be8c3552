/* Golden data of the ops tests: tests/data/ops/ops_golden.gguf, written by
 * scripts/golden/make_op_golden.py from independent references (gguf-py, numpy float64).
 * Tests run from the repository root. Every accessor aborts with the tensor or key name when
 * the file lacks it or its type or size differs: a test must not run on the wrong data. */
#ifndef TANDEM_TESTS_SUPPORT_OPS_GOLDEN_H
#define TANDEM_TESTS_SUPPORT_OPS_GOLDEN_H

#include <stdint.h>

#include "common/gguf.h"

#define OPS_GOLDEN_PATH "tests/data/ops/ops_golden.gguf"

/* Opens the ops golden file (aborts when it cannot). */
gguf_file *golden_open(void);

/* Opens any golden GGUF file (aborts when it cannot). */
gguf_file *golden_open_path(const char *path);

/* Data of tensor name, checked to be type with n elements. */
const void *golden_tensor(const gguf_file *g, const char *name, td_dtype type, int64_t n);

/* Element count of tensor name. */
int64_t golden_count(const gguf_file *g, const char *name);

/* Metadata values. */
uint32_t golden_u32(const gguf_file *g, const char *key);
int64_t golden_i64(const gguf_file *g, const char *key);
float golden_f32(const gguf_file *g, const char *key);
/* Whether the string value of key equals s. */
int golden_str_is(const gguf_file *g, const char *key, const char *s);

/* max |got - want| as a fraction of want's range (max - min), the bound the model tests use;
 * *at receives the worst index. NaN in got counts as infinitely wrong. */
double golden_range_error(const float *got, const float *want, int64_t n, int64_t *at);

/* Largest |a[i] - b[i]| over n values. */
double golden_max_abs_diff(const float *a, const float *b, int64_t n);

#endif
