/* Background responses (/v1/responses with "background": true). Each runs on a thread of its
 * own while the request that made it is answered at once: with the response "queued", or with
 * "stream" with a stream of its events. GET /v1/responses/<id> shows it as it stands, GET
 * /v1/responses/<id>?stream=true&starting_after=N sends its events after sequence number N and
 * follows the rest, POST /v1/responses/<id>/cancel stops it, DELETE stops and forgets it.
 *
 * At most max_running run at once (more are refused with 429); the events of the last
 * max_running that ended stay for GET ?stream=true while they fit max_bytes, their objects
 * as long as the response store keeps them. Every call is safe from every connection
 * thread. */
#ifndef TANDEM_GATEWAY_BACKGROUND_H
#define TANDEM_GATEWAY_BACKGROUND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gateway/api.h"

typedef struct bg_table bg_table;
typedef struct bg_job bg_job;

/* max_running >= 1; max_bytes >= 1: of the ended jobs' events kept (the oldest go first). */
td_err bg_init(bg_table **out, gw_state *g, size_t max_running, size_t max_bytes);
/* Waits until no job runs. Jobs end when the gateway's `stopping` flag is set, so call it
 * after setting that flag (and after the HTTP server stopped, so no reader is left). */
void bg_drain(bg_table *t);
/* Frees the table and every job's events (after bg_drain). */
void bg_free(bg_table *t);

/* Runs s (a checked background Responses request, not started) on a thread of its own and
 * fills r with the queued response, or with a stream of its events when the client asked for
 * one. Takes s (freeing it when the job cannot start). */
void bg_start(api_stream *s, api_reply *r);
/* Whether job was asked to stop (cancel, DELETE). */
bool bg_cancel_asked(const bg_job *job);

/* GET /v1/responses/<id>: false when no job has id; else r is the response as it stands or,
 * with stream, a stream of its events after sequence number after (-1: all of them);
 * client_fd: the reader's socket. */
bool bg_get(bg_table *t, const char *id, bool stream, int64_t after, int client_fd,
            api_reply *r);
/* POST /v1/responses/<id>/cancel: false when no job has id; else r is the response cancelled
 * (waiting for its thread to end it), the same when it was cancelled before, or 400 when it
 * had ended otherwise. */
bool bg_cancel(bg_table *t, const char *id, api_reply *r);
/* The 400 for cancelling a background response that ended with status (not "cancelled"). */
void bg_cannot_cancel(api_reply *r, const char *status);
/* DELETE /v1/responses/<id>: stops job id and makes it unknown here (the caller forgets the
 * kept response too; a job still running forgets it as it ends). False when no job has id. */
bool bg_delete(bg_table *t, const char *id);

/* Jobs running and jobs whose events are kept (for the metrics). */
void bg_usage(bg_table *t, size_t *running, size_t *listed);

/* The reader side of a stream made by bg_start or bg_get (api_stream_read / api_stream_free
 * for an api_stream with `follow`). */
ssize_t bg_read(api_stream *s, char *buf, size_t cap);
void bg_unfollow(api_stream *s);

#endif
