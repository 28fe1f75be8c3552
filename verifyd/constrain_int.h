/* Inside structured output: what verifyd/constrain.c and constrain_vocab.c share. */
#ifndef TANDEM_VERIFYD_CONSTRAIN_INT_H
#define TANDEM_VERIFYD_CONSTRAIN_INT_H

#include "verifyd/constrain.h"

static inline bool cst_bit(const uint32_t *set, int64_t t)
{
    return set[t / 32] >> (t % 32) & 1u;
}

static inline void cst_set(uint32_t *set, int64_t t)
{
    set[t / 32] |= 1u << (t % 32);
}

#endif
