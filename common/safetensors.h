/* safetensors files: a reader over mmap (every size, offset and name checked against the
 * file) and a small writer (test models and tools).
 *
 * Layout: u64 little-endian header length n, n bytes of JSON (an object: tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional "__metadata__" object of
 * strings), then the data section; offsets count from the first byte after the header.
 *
 * Shapes are in the file's order, row-major: shape[n_dims-1] is the fastest-moving dim (the
 * opposite of GGUF's ne[]), so a PyTorch Linear weight [out, in] has shape {out, in}.
 * Every safetensors dtype is recognised so sizes validate; only BF16, F16 and F32 are
 * usable for compute (st_tensor.supported). */
#ifndef TANDEM_COMMON_SAFETENSORS_H
#define TANDEM_COMMON_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

#define ST_MAX_DIMS 8
/* Header lengths above this are refused (the reference implementation's limit). */
#define ST_MAX_HEADER 100000000ull

typedef enum st_dtype {
    ST_BOOL,
    ST_U8,
    ST_I8,
    ST_I16,
    ST_U16,
    ST_I32,
    ST_U32,
    ST_I64,
    ST_U64,
    ST_F16,
    ST_BF16,
    ST_F32,
    ST_F64,
    ST_C64,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_F8_E8M0,
    ST_F8_E4M3FNUZ,
    ST_F8_E5M2FNUZ,
    ST_F6_E2M3,
    ST_F6_E3M2,
    ST_F4,
    ST_DTYPE_COUNT
} st_dtype;

typedef struct st_tensor {
    const char *name;         /* NUL-terminated, owned by the st_file */
    st_dtype dtype;
    bool supported;           /* BF16, F16 or F32: usable for compute */
    uint32_t n_dims;          /* 0 (a scalar: one element) .. ST_MAX_DIMS */
    uint64_t shape[ST_MAX_DIMS]; /* elements per dim, row-major (last dim fastest); unused = 0 */
    uint64_t n_elements;      /* product of shape */
    uint64_t offset;          /* bytes from the start of the data section */
    uint64_t bytes;           /* size of the data */
    const void *data;         /* into the file image; aligned only as the writer laid it out */
} st_tensor;

typedef struct st_meta {
    const char *key;          /* NUL-terminated */
    const char *value;        /* NUL-terminated */
} st_meta;

typedef struct st_file {
    size_t n_tensors;
    st_tensor *tensors;       /* [n_tensors], sorted by data offset */
    size_t n_meta;
    st_meta *meta;            /* [n_meta] "__metadata__" entries, in file order */
    uint64_t header_size;     /* bytes of JSON after the 8-byte length */
    const uint8_t *base;      /* the whole file */
    uint64_t size;            /* bytes */
    /* private */
    void *map;                /* mmap base, or NULL for st_open_memory */
    void *json;               /* the parsed header (names and metadata point into it) */
    const st_tensor **by_name; /* [n_tensors] sorted by name, for st_find */
} st_file;

/* Opens and validates a file. On error *out is NULL and err_msg() names the tensor and the
 * problem. Errors: TD_EIO (open/stat/mmap), TD_EFORMAT (malformed), TD_ERANGE (a size or
 * offset out of bounds), TD_ENOTSUP (an unknown dtype). */
td_err st_open(st_file **out, const char *path);

/* Parses a safetensors image already in memory (not copied: it must outlive the st_file). */
td_err st_open_memory(st_file **out, const void *data, size_t size);

void st_close(st_file *f);

/* Tensor lookup by name; NULL when absent. */
const st_tensor *st_find(const st_file *f, const char *name);

/* A "__metadata__" value; NULL when absent. */
const char *st_meta_get(const st_file *f, const char *key);

/* The compute type of a tensor: TD_F32, TD_F16 or TD_BF16; TD_ENOTSUP naming the tensor and
 * its dtype otherwise. */
td_err st_tensor_type(const st_tensor *t, td_dtype *out);

/* "BF16" etc. (the file's spelling); "?" when out of range. */
const char *st_dtype_name(st_dtype d);

/* Parses a file's dtype string; TD_ENOTSUP when it is not a safetensors dtype. */
td_err st_dtype_parse(const char *s, st_dtype *out);

/* Bytes of n elements, rounding nothing: sub-byte dtypes (F4, F6) need n * bits to be a whole
 * number of bytes. TD_EFORMAT when it is not, TD_ERANGE on overflow. */
td_err st_dtype_bytes(st_dtype d, uint64_t n, uint64_t *bytes);

/* --- writer ------------------------------------------------------------------------ */

typedef struct st_entry {
    const char *name;
    st_dtype dtype;
    uint32_t n_dims;          /* 0..ST_MAX_DIMS */
    const uint64_t *shape;    /* [n_dims], row-major; may be NULL when n_dims is 0 */
    const void *data;         /* [bytes] */
    uint64_t bytes;           /* must equal st_dtype_bytes(dtype, product of shape) */
} st_entry;

/* Serialises tensors (and optional metadata key/value strings) into a malloc'd image as the
 * reference writer lays it out: header padded with spaces to a multiple of 8, tensors packed
 * with no gaps, ordered by element size (largest first, so every tensor stays naturally
 * aligned) and then as given. Errors: TD_EINVAL (bad entry, duplicate name), TD_ENOMEM. */
td_err st_serialize(const st_entry *entries, size_t n, const st_meta *meta, size_t n_meta,
                    uint8_t **out, size_t *size);

/* st_serialize straight to a file (the data is streamed, not copied). */
td_err st_write(const char *path, const st_entry *entries, size_t n, const st_meta *meta,
                size_t n_meta);

#endif
