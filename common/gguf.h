/* GGUF v2/v3 files: a reader over mmap (every size and offset checked against the file)
 * and a writer (test models and tools).
 *
 * Strings point into the mapping and are NOT NUL-terminated (gguf_str: pointer + length).
 * Numeric array elements stay in the mapping, little-endian and possibly unaligned: read them
 * with gguf_arr_* accessors. Tensor data offsets are multiples of the file's alignment from
 * the start of the file, so with gguf_open (page-aligned mapping) the data pointers are
 * aligned to min(alignment, page size); gguf_open_memory keeps the caller's buffer alignment.
 *
 * Big-endian files and GGUF v1 (32-bit counts) are refused with a message. Every count and
 * length is checked against the bytes left before anything is allocated, so a hostile file
 * costs at most a few times its own size in memory. */
#ifndef TANDEM_COMMON_GGUF_H
#define TANDEM_COMMON_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

typedef enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ALIGNMENT (1u << 20) /* a larger general.alignment is refused: padding up to it
                                       * costs that many bytes in every file written */
#define GGUF_MAX_NAME 255   /* bytes of a tensor name (llama.cpp itself allows 63) */
#define GGUF_MAX_NESTING 8  /* array levels: an array of arrays of u8 is 2 */

typedef struct gguf_str {
    const char *ptr; /* into the mapping (or the writer's copy); not NUL-terminated */
    uint64_t len;    /* bytes */
} gguf_str;

typedef struct gguf_value gguf_value;
struct gguf_value {
    gguf_type type;
    union {
        uint64_t u64; /* UINT8..UINT64 */
        int64_t i64;  /* INT8..INT64 */
        double f64;   /* FLOAT32, FLOAT64 */
        bool b;       /* BOOL */
        gguf_str str; /* STRING */
        struct {
            gguf_type elem;     /* element type */
            uint64_t n;         /* element count */
            const uint8_t *raw; /* numeric/bool elements: n * size, little-endian, unaligned */
            gguf_value *items;  /* STRING or ARRAY elements: n parsed values; else NULL */
        } arr;
    };
};

typedef struct gguf_kv {
    gguf_str key;
    gguf_value value;
} gguf_kv;

typedef struct gguf_tensor {
    char name[GGUF_MAX_NAME + 1]; /* NUL-terminated copy; names have no NUL byte inside */
    uint32_t n_dims;            /* 1..GGUF_MAX_DIMS */
    int64_t ne[GGUF_MAX_DIMS];  /* elements per dim, ne[0] fastest (row length); unused = 1 */
    td_dtype type;
    uint64_t offset;            /* bytes from the start of the data section */
    uint64_t size;              /* bytes */
    const void *data;           /* into the mapping */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;       /* 2 or 3 */
    uint64_t n_kv;          /* key/value pairs */
    gguf_kv *kv;            /* [n_kv] in file order */
    uint64_t n_tensors;     /* tensor infos */
    gguf_tensor *tensors;   /* [n_tensors] in file order */
    uint32_t alignment;     /* general.alignment or 32 */
    uint64_t data_offset;   /* bytes from file start to the data section */
    const uint8_t *base;    /* the whole file */
    uint64_t size;          /* bytes */
    /* private */
    void *map;                  /* mmap base, or NULL for gguf_open_memory */
    struct gguf_arena *arena;   /* parsed values, kv and tensor arrays, lookup tables */
} gguf_file;

/* Opens and validates a file. On error *out is NULL and err_msg() names the problem (the
 * path, then the key / tensor / byte offset). TD_EFORMAT: malformed or truncated; TD_ENOTSUP:
 * v1, big-endian, unknown version or tensor type; TD_EIO / TD_ENOENT: the file itself. */
td_err gguf_open(gguf_file **out, const char *path);

/* Parses a GGUF image already in memory (not copied: it must outlive the gguf_file). */
td_err gguf_open_memory(gguf_file **out, const void *data, size_t size);

void gguf_close(gguf_file *g);

/* Metadata lookup (hashed); NULL when absent. */
const gguf_value *gguf_get(const gguf_file *g, const char *key);

/* Typed getters: TD_ENOENT when the key is absent, TD_EFORMAT when its type does not
 * convert (integers convert between widths when the value fits; floats accept integers). */
td_err gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out);
td_err gguf_get_u64(const gguf_file *g, const char *key, uint64_t *out);
td_err gguf_get_i64(const gguf_file *g, const char *key, int64_t *out);
td_err gguf_get_f32(const gguf_file *g, const char *key, float *out);
td_err gguf_get_bool(const gguf_file *g, const char *key, bool *out);
td_err gguf_get_str(const gguf_file *g, const char *key, gguf_str *out);
/* The array under key: TD_ENOENT when absent, TD_EFORMAT when not an array. */
td_err gguf_get_arr(const gguf_file *g, const char *key, const gguf_value **out);

/* Array element access with bounds and type checks: TD_ERANGE when i >= n, TD_EFORMAT when
 * the element type does not convert, TD_EINVAL when arr is not an array. */
td_err gguf_arr_i64(const gguf_value *arr, uint64_t i, int64_t *out);  /* any integer/bool elem */
td_err gguf_arr_f64(const gguf_value *arr, uint64_t i, double *out);   /* any numeric elem */
td_err gguf_arr_str(const gguf_value *arr, uint64_t i, gguf_str *out); /* STRING elem */
/* Element i of any array as a value of the element type (numbers decoded, strings and
 * nested arrays as they are). */
td_err gguf_arr_get(const gguf_value *arr, uint64_t i, gguf_value *out);

/* Compares a gguf_str with a C string. */
bool gguf_str_eq(gguf_str s, const char *c);

/* Tensor lookup by name (hashed); NULL when absent. */
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);

/* "UINT32", "STRING", ...; "?" for an id outside the enum. */
const char *gguf_type_name(gguf_type t);

/* Bytes of one element of a numeric or bool type; 0 for STRING, ARRAY and unknown ids. */
uint32_t gguf_type_size(gguf_type t);

/* --- writer ------------------------------------------------------------------------ */

/* The writer builds a v3 file in memory order: header, metadata in the order keys were
 * first set, tensor infos in the order added, then each tensor's data padded to the
 * alignment (general.alignment when set, else 32).
 *
 * The set_* calls cannot fail on the spot: an allocation failure or an invalid value is
 * remembered and returned by gguf_writer_write / gguf_writer_write_mem. */
typedef struct gguf_writer gguf_writer;

/* NULL only when out of memory. */
gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);

/* Setting a key twice replaces its value. Strings and data are copied. */
void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
void gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Numeric array: n elements of elem type, little-endian, packed. */
void gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_type elem, const void *data, uint64_t n);
void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
/* Any value, deep-copied: every scalar width, strings with NUL bytes, arrays of arrays
 * (at most GGUF_MAX_NESTING levels), or a value taken from a gguf_file. */
void gguf_writer_set_value(gguf_writer *w, const char *key, const gguf_value *v);

/* Adds a tensor; size must equal dtype_bytes(type, product of ne). */
td_err gguf_writer_add_tensor(gguf_writer *w, const char *name, td_dtype type, uint32_t n_dims,
                              const int64_t *ne, const void *data, uint64_t size);

/* Writes the file (removed again when writing fails). */
td_err gguf_writer_write(gguf_writer *w, const char *path);

/* The same bytes in one malloc'd buffer: *out (free() it) of *size bytes. */
td_err gguf_writer_write_mem(gguf_writer *w, uint8_t **out, uint64_t *size);

#endif
