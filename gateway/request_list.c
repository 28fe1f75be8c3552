/* Pages of OpenAI list endpoints (request.h: req_list_page). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/request_int.h"

#define LIST_LIMIT_DEFAULT 20

/* OpenAI's `include` names; items here hold text only, so none of them adds anything. */
static const char *const LIST_INCLUDE[] = {
    "code_interpreter_call.outputs", "computer_call_output.output.image_url",
    "file_search_call.results", "message.input_image.image_url", "message.output_text.logprobs",
    "reasoning.encrypted_content", "web_search_call.action.sources",
};

/* The query's settings for a page. */
typedef struct list_query {
    long limit;
    bool asc;
    const char *after, *before; /* ids, or NULL */
} list_query;

static td_err list_bad(api_error *e, const char *param, const char *want, const char *got)
{
    return apierr_set(e, 400, "invalid_value", param,
                      "Invalid value for '%s': expected %s, got '%s'.", param, want,
                      got ? got : "");
}

static td_err list_query_parse(const req_arg *args, size_t n, list_query *q, api_error *e)
{
    *q = (list_query){.limit = LIST_LIMIT_DEFAULT};
    for (size_t i = 0; i < n; i++) {
        const char *k = args[i].key, *v = args[i].value;
        if (strcmp(k, "limit") == 0) {
            char *end = NULL;
            errno = 0;
            const long l = v && *v >= '0' && *v <= '9' ? strtol(v, &end, 10) : -1;
            if (l < 1 || l > REQ_LIST_LIMIT_MAX || errno || !end || *end)
                return list_bad(e, "limit", "an integer from 1 to 100", v);
            q->limit = l;
        } else if (strcmp(k, "order") == 0) {
            if (!v || (strcmp(v, "asc") && strcmp(v, "desc")))
                return list_bad(e, "order", "'asc' or 'desc'", v);
            q->asc = strcmp(v, "asc") == 0;
        } else if (strcmp(k, "after") == 0 || strcmp(k, "before") == 0) {
            if (!v || !*v)
                return list_bad(e, k, "an item id", v);
            *(k[0] == 'a' ? &q->after : &q->before) = v;
        } else if (strcmp(k, "include") == 0 || strcmp(k, "include[]") == 0) {
            size_t j = 0;
            const size_t n_inc = sizeof LIST_INCLUDE / sizeof LIST_INCLUDE[0];
            while (j < n_inc && (!v || strcmp(v, LIST_INCLUDE[j])))
                j++;
            if (j == n_inc)
                return apierr_set(e, 400, "invalid_value", "include",
                                  "Invalid value for 'include': '%s' is not one of OpenAI's "
                                  "include names (e.g. 'message.output_text.logprobs').",
                                  v ? v : "");
        }
    }
    return TD_OK;
}

/* The position of the item with id in the listed order, or -1. */
static long list_find(const json_t *items, bool asc, const char *id)
{
    const size_t n = json_array_size(items);
    for (size_t i = 0; i < n; i++) {
        const json_t *it_id = json_object_get(json_array_get(items, i), "id");
        if (json_is_string(it_id) && strcmp(json_string_value(it_id), id) == 0)
            return (long)(asc ? i : n - 1 - i);
    }
    return -1;
}

td_err req_list_page(const json_t *items, const req_arg *args, size_t n_args, json_t **out,
                     api_error *e)
{
    *out = NULL;
    list_query q;
    TD_TRY(list_query_parse(args, n_args, &q, e));
    const long n = (long)json_array_size(items);
    long lo = 0, hi = n; /* the listed range [lo, hi) */
    static const char *const names[2] = {"after", "before"};
    const char *ids[2] = {q.after, q.before};
    for (int k = 0; k < 2; k++) {
        if (!ids[k])
            continue;
        const long at = list_find(items, q.asc, ids[k]);
        if (at < 0)
            return apierr_set(e, 400, "invalid_value", names[k],
                              "Invalid value for '%s': no input item of this response has the "
                              "id '%s'.", names[k], ids[k]);
        if (k == 0)
            lo = at + 1;
        else
            hi = at;
    }
    if (hi < lo)
        hi = lo;
    /* before alone: the items right before it; otherwise the first after lo. */
    const bool back = q.before && !q.after;
    const long start = back && hi - lo > q.limit ? hi - q.limit : lo;
    const long end = back || hi - start <= q.limit ? hi : start + q.limit;
    json_t *data = json_array();
    for (long i = start; data && i < end; i++) {
        json_t *it = json_array_get(items, (size_t)(q.asc ? i : n - 1 - i));
        if (json_array_append(data, it) != 0) {
            json_decref(data);
            data = NULL;
        }
    }
    json_t *first = json_incref(json_object_get(json_array_get(data, 0), "id"));
    json_t *last = json_incref(json_object_get(json_array_get(data, json_array_size(data) - 1),
                                               "id"));
    const bool more = back ? start > lo : end < hi;
    *out = data ? json_pack("{s:s,s:o,s:o?,s:o?,s:b}", "object", "list", "data", data,
                            "first_id", first, "last_id", last, "has_more", more)
                : NULL;
    if (!*out)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    return TD_OK;
}

td_err req_response_query(const req_arg *args, size_t n_args, bool *stream, int64_t *after,
                          api_error *e)
{
    *stream = false;
    *after = -1;
    for (size_t i = 0; i < n_args; i++) {
        const char *k = args[i].key, *v = args[i].value;
        if (strcmp(k, "stream") == 0) {
            if (!v || (strcmp(v, "true") && strcmp(v, "false")))
                return list_bad(e, "stream", "'true' or 'false'", v);
            *stream = strcmp(v, "true") == 0;
        } else if (strcmp(k, "starting_after") == 0) {
            char *end = NULL;
            errno = 0;
            const long long l = v && *v >= '0' && *v <= '9' ? strtoll(v, &end, 10) : -1;
            if (l < 0 || errno || !end || *end)
                return list_bad(e, "starting_after", "an event's sequence number (0 or more)",
                                v);
            *after = l;
        }
    }
    return TD_OK;
}
