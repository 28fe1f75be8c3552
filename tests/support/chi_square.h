/* A goodness-of-fit test for tests that check draws against a distribution. */
#ifndef TANDEM_TESTS_SUPPORT_CHI_SQUARE_H
#define TANDEM_TESTS_SUPPORT_CHI_SQUARE_H

#include <stdint.h>

/* The upper-tail p-value of the chi-square statistic of counts obs[V] (total draws) against
 * probabilities expect[V] (Wilson-Hilferty approximation; cells expecting fewer than 5 draws
 * lumped into one); 0 when a token with no mass was drawn. */
double chi_square_p(const int *obs, const double *expect, int64_t V, int total);

#endif
