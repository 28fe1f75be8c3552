/* FNV-1a, 64-bit: the one byte hash of the tree (hash tables, cache keys). Not for anything
 * an adversary chooses the keys of where collisions would cost more than a probe. */
#ifndef TANDEM_COMMON_HASH_H
#define TANDEM_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

#define TD_HASH_SEED 0xcbf29ce484222325ull /* FNV-1a's offset basis */

/* h extended by the n bytes at p (start from TD_HASH_SEED). */
static inline uint64_t td_hash(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull; /* FNV-1a's prime */
    return h;
}

#endif
