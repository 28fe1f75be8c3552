#include "common/args.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const args_opt *args_find(const args_opt *opts, const char *name, size_t len)
{
    for (const args_opt *o = opts; o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
    return NULL;
}

static td_err args_set(const args_opt *o, const char *text, const char *source)
{
    char *end = NULL;
    switch (o->type) {
    case ARGS_FLAG:
        if (!text) {
            *(bool *)o->value = true;
            return TD_OK;
        }
        if (!strcmp(text, "1") || !strcmp(text, "true") || !strcmp(text, "yes") || !strcmp(text, "on"))
            *(bool *)o->value = true;
        else if (!strcmp(text, "0") || !strcmp(text, "false") || !strcmp(text, "no") || !strcmp(text, "off"))
            *(bool *)o->value = false;
        else
            return err_set(TD_EINVAL, "%s --%s: expected true or false, got '%s'", source, o->name, text);
        return TD_OK;
    case ARGS_STRING:
        *(const char **)o->value = text;
        return TD_OK;
    case ARGS_INT: {
        errno = 0;
        long long v = strtoll(text, &end, 0);
        if (errno || end == text || *end)
            return err_set(TD_EINVAL, "%s --%s: expected an integer, got '%s'", source, o->name, text);
        if ((o->min || o->max) && (v < o->min || v > o->max))
            return err_set(TD_ERANGE, "%s --%s: %lld is outside %" PRId64 "..%" PRId64, source,
                           o->name, v, o->min, o->max);
        *(int64_t *)o->value = v;
        return TD_OK;
    }
    case ARGS_DOUBLE: {
        errno = 0;
        double v = strtod(text, &end);
        if (errno || end == text || *end || !isfinite(v))
            return err_set(TD_EINVAL, "%s --%s: expected a number, got '%s'", source, o->name, text);
        *(double *)o->value = v;
        return TD_OK;
    }
    }
    TD_ASSERT(!"unknown option type");
    return TD_EINVAL;
}

td_err args_parse(int argc, char **argv, int first, const args_opt *opts,
                  const char **positional, int max_positional, int *n_positional, bool *help)
{
    int npos = 0;
    bool seen[256] = {0};
    int nopts = 0;
    while (opts[nopts].name)
        nopts++;
    TD_ASSERT(nopts <= 256);
    if (help)
        *help = false;

    bool only_positional = false;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!only_positional && a[0] == '-' && a[1] && a[1] != '-' && a[2] == '\0') {
            const args_opt *o = opts;
            while (o->name && o->short_name != a[1])
                o++;
            if (o->name) {
                const char *text = NULL;
                if (o->type != ARGS_FLAG) {
                    if (i + 1 >= argc)
                        return err_set(TD_EINVAL, "option -%c needs a value", a[1]);
                    text = argv[++i];
                }
                TD_TRY(args_set(o, text, "option"));
                seen[o - opts] = true;
                continue;
            }
        }
        if (only_positional || a[0] != '-' || a[1] != '-' || a[2] == '\0') {
            if (!only_positional && !strcmp(a, "--")) {
                only_positional = true;
                continue;
            }
            if (npos >= max_positional)
                return err_set(TD_EINVAL, "unexpected argument '%s'", a);
            positional[npos++] = a;
            continue;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (len == 4 && !strncmp(name, "help", 4) && help) {
            *help = true;
            break;
        }
        const args_opt *o = args_find(opts, name, len);
        if (!o)
            return err_set(TD_EINVAL, "unknown option '--%.*s'", (int)len, name);
        const char *text = eq ? eq + 1 : NULL;
        if (!text && o->type != ARGS_FLAG) {
            if (i + 1 >= argc)
                return err_set(TD_EINVAL, "option --%s needs a value", o->name);
            text = argv[++i];
        }
        TD_TRY(args_set(o, text, "option"));
        seen[o - opts] = true;
    }
    for (int k = 0; k < nopts; k++) {
        const char *env = opts[k].env ? getenv(opts[k].env) : NULL;
        if (seen[k] || !env || !*env)
            continue;
        TD_TRY(args_set(&opts[k], env, opts[k].env));
    }
    if (n_positional)
        *n_positional = npos;
    return TD_OK;
}

void args_usage(const char *usage, const args_opt *opts)
{
    printf("usage: %s\n", usage);
    for (const args_opt *o = opts; o->name; o++) {
        char left[64];
        const char *meta = o->type == ARGS_FLAG ? "" : o->type == ARGS_STRING ? " S" :
                           o->type == ARGS_INT ? " N" : " X";
        if (o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s", o->short_name, o->name, meta);
        else
            snprintf(left, sizeof left, "--%s%s", o->name, meta);
        printf("  %-24s %s", left, o->help ? o->help : "");
        switch (o->type) {
        case ARGS_STRING:
            if (*(const char **)o->value)
                printf(" (default %s)", *(const char **)o->value);
            break;
        case ARGS_INT:
            printf(" (default %" PRId64 ")", *(int64_t *)o->value);
            break;
        case ARGS_DOUBLE:
            printf(" (default %g)", *(double *)o->value);
            break;
        case ARGS_FLAG:
            break;
        }
        if (o->env)
            printf(" [env %s]", o->env);
        printf("\n");
    }
}

td_err args_names(const char *list, const char *const *names, int n, uint64_t *mask,
                  const char *what, const char *hint)
{
    TD_ASSERT(n >= 0 && n <= 64);
    *mask = 0;
    if (!*list)
        return TD_OK;
    for (const char *s = list;; s++) { /* each item, an empty one after a trailing comma too */
        const size_t len = strcspn(s, ",");
        int i = 0;
        while (i < n && !(strlen(names[i]) == len && strncmp(names[i], s, len) == 0))
            i++;
        if (i == n)
            return err_set(TD_EINVAL, "no %s named '%.*s' (%s)", what, (int)len, s, hint);
        *mask |= (uint64_t)1 << i;
        s += len;
        if (!*s)
            return TD_OK;
    }
}
