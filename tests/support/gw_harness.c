/* The gateway over real HTTP against the stand-in verifyd (tests/support/gw_harness.h). */
#include "tests/support/gw_harness.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/bus.h"
#include "common/chat.h"
#include "common/gguf.h"
#include "gateway/http.h"
#include "tests/support/clock.h"
#include "tests/support/tmp_dir.h"
static char run_dir[64];
static char verifyd_url[BUS_URL_MAX], events_url[BUS_URL_MAX];
gw_state gwh_g;
static http_server *srv;
fake_verifyd *gwh_fake;
static uint16_t port;

/* --- a small HTTP/1.0 client: the server closes the connection after each reply ------------- */

int gwh_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

void gwh_send(int fd, const char *method, const char *path, const char *headers,
                         const char *body, size_t body_len)
{
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n%s\r\n",
                     method, path, body_len, headers ? headers : "");
    assert_int_equal(write(fd, head, (size_t)n), n);
    size_t off = 0;
    while (off < body_len) {
        ssize_t w = write(fd, body + off, body_len - off);
        if (w <= 0)
            break; /* the server may close early on a huge body */
        off += (size_t)w;
    }
}

/* The whole reply; *body points into it. Returns the status. */
int gwh_read(int fd, char **reply, char **body)
{
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    buf[len] = 0;
    close(fd);
    int status = 0;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    char *b = strstr(buf, "\r\n\r\n");
    *body = b ? b + 4 : buf + len;
    *reply = buf;
    return status;
}

int gwh_request(const char *method, const char *path, const char *headers, const char *body,
                   char **reply, char **out_body)
{
    int fd = gwh_connect();
    gwh_send(fd, method, path, headers, body ? body : "", body ? strlen(body) : 0);
    return gwh_read(fd, reply, out_body);
}

/* Replaces the random parts of ids and the times: chatcmpl-<hex> -> chatcmpl-X, cmpl-<hex> ->
 * cmpl-X, "call_<hex>_ -> "call_X_, and the Responses API's "resp_, "rs_, "msg_, "fc_, "fco_
 * likewise;
 * "created":<n> -> "created":0, and so "created_at" and "completed_at". */
void gwh_normalize(char *s)
{
    static const char *const prefixes[] = {"\"created\":", "\"created_at\":",
                                           "\"completed_at\":", "chatcmpl-", "\"cmpl-", "\"call_",
                                           "\"resp_", "\"rs_", "\"msg_", "\"fc_",
                                           "\"fco_"};
    for (size_t k = 0; k < sizeof prefixes / sizeof prefixes[0]; k++) {
        size_t plen = strlen(prefixes[k]);
        for (char *p = strstr(s, prefixes[k]); p; p = strstr(p + plen, prefixes[k])) {
            char *q = p + plen, *e = q;
            while (isxdigit((unsigned char)*e))
                e++;
            if (e == q)
                continue;
            *q = k < 3 ? '0' : 'X';
            memmove(q + 1, e, strlen(e) + 1);
        }
    }
}

void gwh_encode(const char *text, fake_script *s)
{
    tok_ids ids = {0};
    assert_int_equal(tok_encode(gwh_g.tok, text, strlen(text), 0, &ids), TD_OK);
    for (size_t i = 0; i < ids.n; i++)
        s->tokens[i] = (uint32_t)ids.ids[i];
    s->n_tokens = (uint32_t)ids.n;
    tok_ids_free(&ids);
}

/* text's tokens with flags (TOK_ENC_*), into out [cap]. */
size_t gwh_tokens(const char *text, unsigned flags, uint32_t *out, size_t cap)
{
    tok_ids ids = {0};
    assert_int_equal(tok_encode(gwh_g.tok, text, strlen(text), flags, &ids), TD_OK);
    assert_true(ids.n <= cap);
    for (size_t i = 0; i < ids.n; i++)
        out[i] = (uint32_t)ids.ids[i];
    size_t n = ids.n;
    tok_ids_free(&ids);
    return n;
}

/* The prompt tokens of one user message, rendered independently of the gateway's code. */
size_t gwh_prompt(const char *messages_json, bool think_off, uint32_t *out)
{
    gguf_file *f;
    chat_model cm;
    assert_int_equal(gguf_open(&f, GWH_MODEL), TD_OK);
    assert_int_equal(chat_model_load(&cm, f), TD_OK);
    json_t *msgs = json_loads(messages_json, 0, NULL);
    chat_opts o = {.add_generation_prompt = true,
                   .enable_thinking = think_off ? CHAT_THINK_OFF : CHAT_THINK_UNSET,
                   .eos_token = cm.eos_token};
    char *text;
    size_t len;
    assert_int_equal(chat_render(cm.template_text, cm.template_len, msgs, &o, &text, &len), TD_OK);
    tok_ids ids = {0};
    assert_int_equal(tok_encode(gwh_g.tok, text, len, 0, &ids), TD_OK);
    for (size_t i = 0; i < ids.n; i++)
        out[i] = (uint32_t)ids.ids[i];
    size_t n = ids.n;
    tok_ids_free(&ids);
    free(text);
    json_decref(msgs);
    chat_model_free(&cm);
    gguf_close(f);
    return n;
}

void gwh_wait_health(int want)
{
    for (int i = 0; i < 100; i++) {
        char *reply, *body;
        int st = gwh_request("GET", "/health", NULL, NULL, &reply, &body);
        free(reply);
        if (st == want)
            return;
        sleep_ms(50);
    }
    fail_msg("/health never answered %d", want);
}

td_err gwh_fake_start(uint32_t pid)
{
    return fake_verifyd_start(&gwh_fake, verifyd_url, events_url, pid, GWH_N_CTX, true);
}

int gwh_setup(void **state)
{
    (void)state;
    if (!tmp_dir_make(run_dir, sizeof run_dir, "tandem-gwtest"))
        return -1;
    setenv("TANDEM_RUNTIME_DIR", run_dir, 1);
    if (bus_endpoint(verifyd_url, sizeof verifyd_url, "verifyd") != TD_OK ||
        bus_endpoint(events_url, sizeof events_url, "gateway-events") != TD_OK)
        return -1;
    gw_config cfg = {.model_path = GWH_MODEL, .max_body = 4096, .timeout_s = 5};
    if (gw_init(&gwh_g, &cfg) != TD_OK)
        return -1;
    link_opts lo = {.verifyd_url = verifyd_url, .events_url = events_url, .call_ms = 1000,
                    .poll_ms = 100, .down_ms = 3000};
    if (link_init(&gwh_g.link, &lo) != TD_OK || http_start(&srv, &gwh_g, "127.0.0.1", 0) != TD_OK)
        return -1;
    port = http_port(srv);
    if (gwh_fake_start(1111) != TD_OK)
        return -1;
    gwh_wait_health(200);
    return 0;
}

int gwh_teardown(void **state)
{
    (void)state;
    http_stop(srv);
    link_free(gwh_g.link);
    fake_verifyd_stop(gwh_fake);
    gw_free(&gwh_g);
    return tmp_dir_remove(run_dir) ? 0 : -1;
}
