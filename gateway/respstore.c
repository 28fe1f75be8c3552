#include "gateway/respstore.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* One kept response, in a list from most to least recently used. */
typedef struct rs_entry {
    struct rs_entry *prev, *next;
    char *id;                  /* NUL-terminated */
    char *part[RSTORE_PARTS]; /* compact JSON text of each rstore_part */
    size_t bytes;              /* of the id and the parts */
} rs_entry;

struct rstore {
    pthread_mutex_t mu;
    rs_entry *head, *tail; /* most, least recently used */
    size_t n, bytes;       /* entries, bytes of their strings */
    size_t max_items, max_bytes;
};

td_err rstore_init(rstore **out, size_t max_items, size_t max_bytes)
{
    TD_ASSERT(max_items >= 1 && max_bytes >= 1);
    rstore *s = calloc(1, sizeof *s);
    if (!s)
        return err_set(TD_ENOMEM, "out of memory for the response store");
    pthread_mutex_init(&s->mu, NULL);
    s->max_items = max_items;
    s->max_bytes = max_bytes;
    *out = s;
    return TD_OK;
}

static void rs_entry_free(rs_entry *e)
{
    free(e->id);
    for (int k = 0; k < RSTORE_PARTS; k++)
        free(e->part[k]);
    free(e);
}

static void rs_unlink(rstore *s, rs_entry *e)
{
    *(e->prev ? &e->prev->next : &s->head) = e->next;
    *(e->next ? &e->next->prev : &s->tail) = e->prev;
    e->prev = e->next = NULL;
    s->n--;
    s->bytes -= e->bytes;
}

static void rs_push_front(rstore *s, rs_entry *e)
{
    e->prev = NULL;
    e->next = s->head;
    *(s->head ? &s->head->prev : &s->tail) = e;
    s->head = e;
    s->n++;
    s->bytes += e->bytes;
}

static rs_entry *rs_find(const rstore *s, const char *id)
{
    for (rs_entry *e = s->head; e; e = e->next)
        if (strcmp(e->id, id) == 0)
            return e;
    return NULL;
}

void rstore_free(rstore *s)
{
    if (!s)
        return;
    while (s->head) {
        rs_entry *e = s->head;
        rs_unlink(s, e);
        rs_entry_free(e);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

bool rstore_put(rstore *s, const char *id, const json_t *response, const json_t *conv,
                const json_t *input)
{
    rs_entry *e = calloc(1, sizeof *e);
    if (!e)
        return false;
    const json_t *parts[RSTORE_PARTS] = {[RSTORE_RESPONSE] = response, [RSTORE_CONV] = conv,
                                         [RSTORE_INPUT] = input};
    bool ok = (e->id = strdup(id)) != NULL;
    e->bytes = ok ? strlen(id) : 0;
    for (int k = 0; ok && k < RSTORE_PARTS; k++) {
        ok = (e->part[k] = json_dumps(parts[k], JSON_COMPACT)) != NULL;
        e->bytes += ok ? strlen(e->part[k]) : 0;
    }
    if (!ok || e->bytes > s->max_bytes) {
        rs_entry_free(e);
        return false;
    }
    pthread_mutex_lock(&s->mu);
    rs_entry *old = rs_find(s, id);
    if (old) {
        rs_unlink(s, old);
        rs_entry_free(old);
    }
    while (s->tail && (s->n + 1 > s->max_items || s->bytes + e->bytes > s->max_bytes)) {
        rs_entry *last = s->tail;
        rs_unlink(s, last);
        rs_entry_free(last);
    }
    rs_push_front(s, e);
    pthread_mutex_unlock(&s->mu);
    return true;
}

bool rstore_get(rstore *s, const char *id, rstore_part part, json_t **out)
{
    TD_ASSERT(part >= 0 && part < RSTORE_PARTS);
    *out = NULL;
    pthread_mutex_lock(&s->mu);
    rs_entry *e = rs_find(s, id);
    if (e) { /* used: the last to go */
        rs_unlink(s, e);
        rs_push_front(s, e);
        *out = json_loads(e->part[part], 0, NULL);
    }
    pthread_mutex_unlock(&s->mu);
    return *out != NULL;
}

bool rstore_delete(rstore *s, const char *id)
{
    pthread_mutex_lock(&s->mu);
    rs_entry *e = rs_find(s, id);
    if (e)
        rs_unlink(s, e);
    pthread_mutex_unlock(&s->mu);
    if (e)
        rs_entry_free(e);
    return e != NULL;
}

void rstore_usage(rstore *s, size_t *items, size_t *bytes)
{
    pthread_mutex_lock(&s->mu);
    *items = s->n;
    *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}
