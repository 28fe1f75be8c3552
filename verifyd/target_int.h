/* Internal to the target files: the forward-pass scratch the model keeps. */
#ifndef TANDEM_VERIFYD_TARGET_INT_H
#define TANDEM_VERIFYD_TARGET_INT_H

#include "verifyd/target.h"

/* Gives the model its (empty) forward scratch (target_forward.c). */
td_err tgt_work_init(tgt_model *m);
/* Releases the model's forward scratch. */
void tgt_work_free(const tgt_model *m);

#endif
