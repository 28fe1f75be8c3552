/* Chi-square goodness of fit (tests/support/chi_square.h). */
#include "tests/support/chi_square.h"

#include <math.h>

double chi_square_p(const int *obs, const double *expect, int64_t V, int total)
{
    double chi = 0, df = -1, lump_o = 0, lump_e = 0;
    for (int64_t i = 0; i < V; i++) {
        double e = expect[i] * total;
        if (obs[i] > 0 && expect[i] == 0)
            return 0;
        if (e < 5) {
            lump_o += obs[i];
            lump_e += e;
            continue;
        }
        chi += (obs[i] - e) * (obs[i] - e) / e;
        df++;
    }
    if (lump_e > 0) {
        chi += (lump_o - lump_e) * (lump_o - lump_e) / lump_e;
        df++;
    }
    double z = (pow(chi / df, 1.0 / 3) - (1 - 2 / (9 * df))) / sqrt(2 / (9 * df));
    return 0.5 * erfc(z / sqrt(2.0));
}
