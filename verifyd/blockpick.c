#include "verifyd/blockpick.h"

#include <stdbool.h>
#include <string.h>

#include "common/err.h"

void bp_init(blockpick *p, int64_t most)
{
    TD_ASSERT(most >= 1 && most <= BP_MAX);
    memset(p, 0, sizeof *p);
    p->most = most;
}

double bp_tokens(const blockpick *p, int64_t B)
{
    double h = 0.5, run = 1.0, sum = 1.0;
    for (int64_t k = 1; k < B; k++) {
        h = (p->accepted[k] + BP_PRIOR * h) / (p->offered[k] + BP_PRIOR);
        run *= h;
        sum += run;
    }
    return sum;
}

double bp_cost(const blockpick *p, int64_t B)
{
    if (p->cost[B] > 0)
        return p->cost[B];
    int64_t lo = B - 1, hi = B + 1;
    while (lo >= 1 && p->cost[lo] <= 0)
        lo--;
    while (hi <= p->most && p->cost[hi] <= 0)
        hi++;
    const bool has_lo = lo >= 1, has_hi = hi <= p->most;
    if (has_lo && has_hi)
        return p->cost[lo] + (p->cost[hi] - p->cost[lo]) * (double)(B - lo) / (double)(hi - lo);
    if (has_lo)
        return p->cost[lo];
    if (has_hi)
        return p->cost[hi] * (double)B / (double)hi;
    return 0;
}

int64_t bp_pick(const blockpick *p)
{
    int64_t best = p->most;
    double best_rate = 0;
    for (int64_t B = 1; B <= p->most; B++) {
        const double c = bp_cost(p, B);
        if (c <= 0)
            return p->most;
        const double r = bp_tokens(p, B) / c;
        if (r > best_rate) {
            best_rate = r;
            best = B;
        }
    }
    if (best > 1 || p->most == 1)
        return best;
    const double extra = bp_cost(p, p->most) - bp_cost(p, 1);
    const double known = p->drafting < BP_EVIDENCE ? (double)p->drafting / BP_EVIDENCE : 1.0;
    return BP_EXPLORE * p->plain_s >= extra * known ? p->most : 1;
}

void bp_record(blockpick *p, int64_t B, int64_t n, double seconds)
{
    TD_ASSERT(B >= 1 && B <= p->most && n >= 1 && n <= B);
    if (p->seen[B] < UINT32_MAX)
        p->seen[B]++;
    if (p->seen[B] > 1 && seconds > 0)
        p->cost[B] = p->cost[B] > 0 ? (1 - BP_COST_NEW) * p->cost[B] + BP_COST_NEW * seconds
                                    : seconds;
    const double keep = B > 1 ? BP_DECAY : BP_DECAY_PLAIN;
    for (int64_t k = 1; k < p->most; k++) {
        p->offered[k] *= keep;
        p->accepted[k] *= keep;
    }
    if (B == 1) {
        p->plain_s += seconds;
        return;
    }
    p->plain_s = 0;
    if (p->drafting < BP_EVIDENCE)
        p->drafting++;
    /* drafts 1..n-1 were accepted; draft n, when offered, was not */
    for (int64_t k = 1; k < B && k <= n; k++) {
        p->offered[k] += 1;
        if (k < n)
            p->accepted[k] += 1;
    }
}
