/* What the GGUF reader's files share and no caller needs: the arena behind a gguf_file and
 * its two hash tables (keys, tensor names). */
#ifndef TANDEM_COMMON_GGUF_INTERNAL_H
#define TANDEM_COMMON_GGUF_INTERNAL_H

#include <stdint.h>

#include "common/gguf.h"

/* Open addressing with linear probing over a power-of-two number of slots. */
typedef struct gguf_table {
    uint64_t *slots; /* [mask + 1]: entry index + 1, or 0 when empty */
    uint64_t mask;   /* slots - 1 */
} gguf_table;

typedef struct gguf_arena {
    struct arena_chunk *chunks; /* bump-allocated blocks, freed together */
    gguf_table keys;            /* into gguf_file.kv */
    gguf_table tensors;         /* into gguf_file.tensors */
} gguf_arena;

/* FNV-1a over len bytes. */
uint64_t gguf_hash(const void *p, uint64_t len);

/* Name of entry i of a gguf_file (ctx) for the tables: a key, or a tensor name. */
const char *gguf_kv_name(const void *ctx, uint64_t i, uint64_t *len);
const char *gguf_tensor_name(const void *ctx, uint64_t i, uint64_t *len);

/* Decodes one little-endian element of numeric or bool type t at p (unaligned). */
void gguf_scalar_load(gguf_type t, const uint8_t *p, gguf_value *v);

#endif
