/* The gateway over real HTTP against a stand-in verifyd (tests/support/fake_verifyd): exact
 * bodies and SSE streams for chat and completions, what reaches verifyd in gen_start, stop
 * strings that cancel the generation, tool calls, reasoning, logprobs, errors in the middle of
 * a stream, waiting while verifyd is busy, context overflow, client disconnects that cancel,
 * auth, HTTP errors, metrics, and a verifyd restart that ends open streams. */
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
#include "gateway/gateway.h"
#include "gateway/http.h"
#include "tests/support/clock.h"
#include "tests/support/fake_verifyd.h"
#include "tests/support/tmp_dir.h"

#define MODEL "tests/data/models/qwen35-tiny-f32.gguf"
#define N_CTX 1024 /* positions: room for the tools' system prompt, not for 60 words + 1000 */

static char run_dir[64];
static char verifyd_url[BUS_URL_MAX], events_url[BUS_URL_MAX];
static gw_state g;
static http_server *srv;
static fake_verifyd *fake;
static uint16_t port;

/* --- a small HTTP/1.0 client: the server closes the connection after each reply ------------- */

static int connect_gateway(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_request(int fd, const char *method, const char *path, const char *headers,
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
static int read_reply(int fd, char **reply, char **body)
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

static int request(const char *method, const char *path, const char *headers, const char *body,
                   char **reply, char **out_body)
{
    int fd = connect_gateway();
    send_request(fd, method, path, headers, body ? body : "", body ? strlen(body) : 0);
    return read_reply(fd, reply, out_body);
}

/* Replaces the random parts of ids and the creation time: chatcmpl-<hex> -> chatcmpl-X,
 * cmpl-<hex> -> cmpl-X, call_<hex>_ -> call_X_, "created":<n> -> "created":0. */
static void normalize(char *s)
{
    static const char *const prefixes[] = {"chatcmpl-", "\"cmpl-", "call_", "\"created\":"};
    for (size_t k = 0; k < 4; k++) {
        size_t plen = strlen(prefixes[k]);
        for (char *p = strstr(s, prefixes[k]); p; p = strstr(p + plen, prefixes[k])) {
            char *q = p + plen, *e = q;
            while (isxdigit((unsigned char)*e))
                e++;
            if (e == q)
                continue;
            *q = k == 3 ? '0' : 'X';
            memmove(q + 1, e, strlen(e) + 1);
        }
    }
}

static void encode(const char *text, fake_script *s)
{
    tok_ids ids = {0};
    assert_int_equal(tok_encode(g.tok, text, strlen(text), 0, &ids), TD_OK);
    for (size_t i = 0; i < ids.n; i++)
        s->tokens[i] = (uint32_t)ids.ids[i];
    s->n_tokens = (uint32_t)ids.n;
    tok_ids_free(&ids);
}

/* text's tokens with flags (TOK_ENC_*), into out [cap]. */
static size_t expected_tokens(const char *text, unsigned flags, uint32_t *out, size_t cap)
{
    tok_ids ids = {0};
    assert_int_equal(tok_encode(g.tok, text, strlen(text), flags, &ids), TD_OK);
    assert_true(ids.n <= cap);
    for (size_t i = 0; i < ids.n; i++)
        out[i] = (uint32_t)ids.ids[i];
    size_t n = ids.n;
    tok_ids_free(&ids);
    return n;
}

/* The prompt tokens of one user message, rendered independently of the gateway's code. */
static size_t expected_prompt(const char *messages_json, bool think_off, uint32_t *out)
{
    gguf_file *f;
    chat_model cm;
    assert_int_equal(gguf_open(&f, MODEL), TD_OK);
    assert_int_equal(chat_model_load(&cm, f), TD_OK);
    json_t *msgs = json_loads(messages_json, 0, NULL);
    chat_opts o = {.add_generation_prompt = true,
                   .enable_thinking = think_off ? CHAT_THINK_OFF : CHAT_THINK_UNSET,
                   .eos_token = cm.eos_token};
    char *text;
    size_t len;
    assert_int_equal(chat_render(cm.template_text, cm.template_len, msgs, &o, &text, &len), TD_OK);
    tok_ids ids = {0};
    assert_int_equal(tok_encode(g.tok, text, len, 0, &ids), TD_OK);
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

static void wait_health(int want)
{
    for (int i = 0; i < 100; i++) {
        char *reply, *body;
        int st = request("GET", "/health", NULL, NULL, &reply, &body);
        free(reply);
        if (st == want)
            return;
        sleep_ms(50);
    }
    fail_msg("/health never answered %d", want);
}

static int setup(void **state)
{
    (void)state;
    if (!tmp_dir_make(run_dir, sizeof run_dir, "tandem-gwtest"))
        return -1;
    setenv("TANDEM_RUNTIME_DIR", run_dir, 1);
    if (bus_endpoint(verifyd_url, sizeof verifyd_url, "verifyd") != TD_OK ||
        bus_endpoint(events_url, sizeof events_url, "gateway-events") != TD_OK)
        return -1;
    gw_config cfg = {.model_path = MODEL, .max_body = 4096, .timeout_s = 5};
    if (gw_init(&g, &cfg) != TD_OK)
        return -1;
    link_opts lo = {.verifyd_url = verifyd_url, .events_url = events_url, .call_ms = 1000,
                    .poll_ms = 100, .down_ms = 3000};
    if (link_init(&g.link, &lo) != TD_OK || http_start(&srv, &g, "127.0.0.1", 0) != TD_OK)
        return -1;
    port = http_port(srv);
    if (fake_verifyd_start(&fake, verifyd_url, events_url, 1111, N_CTX, true) != TD_OK)
        return -1;
    wait_health(200);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    http_stop(srv);
    link_free(g.link);
    fake_verifyd_stop(fake);
    gw_free(&g);
    return tmp_dir_remove(run_dir) ? 0 : -1;
}

static const char HI[] = "[{\"role\":\"user\",\"content\":\"hi\"}]";

/* --- chat ----------------------------------------------------------------------------------- */

static void chat_whole_response_and_what_verifyd_receives(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .cached = 3};
    encode("Hello world", &s); /* 8 tokens: 4 steps of 2 */
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    int st = request("POST", "/v1/chat/completions", NULL,
                     "{\"model\":\"qwen35-tiny\",\"messages\":[{\"role\":\"user\",\"content\":"
                     "\"hi\"}],\"max_tokens\":10,\"temperature\":0,\"seed\":5,"
                     "\"chat_template_kwargs\":{\"enable_thinking\":false},\"unknown\":1}",
                     &reply, &body);
    assert_int_equal(st, 200);
    normalize(body);
    uint32_t want[256], got[256], stop[8];
    size_t n = expected_prompt(HI, true, want);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "{\"id\":\"chatcmpl-X\",\"object\":\"chat.completion\",\"created\":0,\"model\":"
             "\"qwen35-tiny\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
             "\"content\":\"Hello world\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
             "\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":8,\"total_tokens\":%zu,"
             "\"prompt_tokens_details\":{\"cached_tokens\":3},\"acceptance_length\":2.0}}",
             n, n + 8);
    assert_string_equal(body, expect);
    free(reply);

    msg_gen_start m;
    assert_true(fake_verifyd_last_start(fake, &m, got, 256, stop, 8));
    assert_int_equal(m.n_prompt, n);
    assert_memory_equal(got, want, n * sizeof *got);
    assert_int_equal(m.max_tokens, 10);
    assert_true(m.sampler.temperature == 0.0f);
    assert_int_equal(m.sampler.seed, 5);
    assert_int_equal(m.n_stop, 1);
    assert_int_equal(stop[0], 506); /* <|im_end|>: eos and eot of the tiny vocabulary */
    assert_false(m.logprobs);
    assert_false(m.ignore_eos);
}

static void chat_stream_sends_exact_chunks(void **state)
{
    (void)state;
    fake_script s = {.step = 3};
    encode("Hello world", &s);
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    int st = request("POST", "/v1/chat/completions", NULL,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
                     "\"stream_options\":{\"include_usage\":true},\"chat_template_kwargs\":"
                     "{\"enable_thinking\":false}}",
                     &reply, &body);
    assert_int_equal(st, 200);
    assert_non_null(strstr(reply, "Content-Type: text/event-stream"));
    normalize(body);
    /* Steps of 3 tokens: "Hello world" decodes as "Hel" + "lo wo" + "rld"? Take it from the
     * tokenizer so only the framing is pinned here. */
    char pieces[3][32];
    for (int k = 0; k < 3; k++) {
        tok_bytes b = {0};
        uint32_t n = k < 2 ? 3 : s.n_tokens - 6;
        assert_int_equal(tok_decode(g.tok, (const int32_t *)s.tokens + 3 * k, n, 0, &b), TD_OK);
        snprintf(pieces[k], sizeof pieces[k], "%s", b.ptr);
        tok_bytes_free(&b);
    }
    const char *head = "data: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\","
                       "\"created\":0,\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":0,";
    uint32_t prompt[256];
    size_t n = expected_prompt(HI, true, prompt);
    char expect[4096];
    snprintf(expect, sizeof expect,
             "%s\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
             "\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
             "data: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\",\"created\":0,"
             "\"model\":\"qwen35-tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":%zu,"
             "\"completion_tokens\":8,\"total_tokens\":%zu,\"prompt_tokens_details\":"
             "{\"cached_tokens\":0},\"acceptance_length\":2.667}}\n\n"
             "data: [DONE]\n\n",
             head, head, pieces[0], head, pieces[1], head, pieces[2], head, n, n + 8);
    assert_string_equal(body, expect);
    free(reply);
}

static void stop_string_ends_the_text_and_cancels_verifyd(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .delay_ms = 30};
    encode("hello END world and more", &s);
    fake_verifyd_script(fake, &s);
    int cancels = fake_verifyd_cancels(fake);
    char *reply, *body;
    int st = request("POST", "/v1/chat/completions", NULL,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stop\":[\"END\"],"
                     "\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                     &reply, &body);
    assert_int_equal(st, 200);
    json_t *j = json_loads(body, 0, NULL);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(json_object_get(choice, "message"),
                                                          "content")),
                        "hello ");
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "stop");
    /* "hello END" is 7 tokens: the tokens after the stop string do not count. */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                        "completion_tokens")),
                     7);
    json_decref(j);
    free(reply);
    assert_int_equal(fake_verifyd_cancels(fake), cancels + 1);
    /* include_stop_str_in_output: the text ends with the stop string */
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":\"x\",\"stop\":\"END\",\"include_stop_str_in_output\":true}",
                             &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"text\":\"hello END\",\"logprobs\":null,\"finish_reason\":"
                                 "\"stop\""));
    free(reply);
}

static void tool_call_in_the_output_becomes_tool_calls(void **state)
{
    (void)state;
    fake_script s = {.step = 4};
    encode("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
           "</function>\n</tool_call>",
           &s);
    fake_verifyd_script(fake, &s);
    const char *req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"chat_template_kwargs\":"
        "{\"enable_thinking\":false},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
        "{\"type\":\"string\"}}}}}]%s}";
    char body_req[1024];
    snprintf(body_req, sizeof body_req, req, "");
    char *reply, *body;
    int st = request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body);
    if (st != 200)
        fail_msg("%d %s", st, body);
    normalize(body);
    assert_non_null(strstr(body, "\"message\":{\"role\":\"assistant\",\"content\":null,"
                                 "\"tool_calls\":[{\"id\":\"call_X_0\",\"type\":\"function\","
                                 "\"function\":{\"name\":\"get_weather\",\"arguments\":"
                                 "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},\"logprobs\":null,"
                                 "\"finish_reason\":\"tool_calls\"}"));
    free(reply);
    snprintf(body_req, sizeof body_req, req, ",\"stream\":true");
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body), 200);
    normalize(body);
    assert_non_null(strstr(body, "\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_X_0\","
                                 "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                                 "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
                                 "\"logprobs\":null,\"finish_reason\":null}"));
    assert_non_null(strstr(body, "\"delta\":{},\"logprobs\":null,\"finish_reason\":"
                                 "\"tool_calls\"}]}\n\ndata: [DONE]\n\n"));
    assert_null(strstr(body, "\"content\":\"<"));
    free(reply);
}

/* A required call (named here) goes to verifyd with the tool spec it matches the call
 * against: the model's template teaches the XML form, and only the named function is in it;
 * tools whose schemas cannot be enforced are this request's 400, before verifyd is asked.
 * With tool_choice "auto" every tool is in the spec, or calls stay free. */
static void required_call_sends_the_tool_spec(void **state)
{
    (void)state;
    fake_script s = {.step = 4};
    encode("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
           "</function>\n</tool_call>",
           &s);
    fake_verifyd_script(fake, &s);
    const char *req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"chat_template_kwargs\":"
        "{\"enable_thinking\":false},\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"get_time\"}},{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
        "{\"type\":\"string\"%s}}}}}],\"tool_choice\":{\"type\":\"function\",\"function\":"
        "{\"name\":\"get_weather\"}}}";
    char body_req[1024];
    snprintf(body_req, sizeof body_req, req, "");
    char *reply, *body;
    const int starts = fake_verifyd_starts(fake);
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body), 200);
    assert_non_null(strstr(body, "\"finish_reason\":\"tool_calls\""));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_int_equal(m.format, MSG_FORMAT_TOOL_CALL);
    const char *spec = "{\"form\":\"xml\",\"tools\":[{\"name\":\"get_weather\",\"parameters\":"
                       "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}]}";
    assert_int_equal(m.n_schema, strlen(spec));
    assert_string_equal(m.schema, spec);
    snprintf(body_req, sizeof body_req, req, ",\"pattern\":\"^[A-Z]\"");
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body), 400);
    assert_non_null(strstr(body, "\"message\":\"The tools cannot be enforced for a required "
                                 "call: tool call: function 'get_weather' parameter 'city': "));
    assert_non_null(strstr(body, "pattern"));
    assert_non_null(strstr(body, "\"param\":\"tools\",\"code\":\"unsupported_value\""));
    free(reply);
    assert_int_equal(fake_verifyd_starts(fake), starts + 1);

    /* tool_choice "auto": the calls the model opens are matched against every tool; with a
     * schema that cannot be enforced they are left free instead (no error) */
    const char *auto_req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"get_time\"}},{\"type\":\"function\",\"function\":"
        "{\"name\":\"get_weather\",\"parameters\":{\"properties\":{\"city\":{%s}}}}}]}";
    snprintf(body_req, sizeof body_req, auto_req, "\"type\":\"string\"");
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body), 200);
    free(reply);
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_int_equal(m.format, MSG_FORMAT_TOOLS);
    assert_string_equal(m.schema, "{\"form\":\"xml\",\"tools\":[{\"name\":\"get_time\"},{\"name\":"
                                  "\"get_weather\",\"parameters\":{\"properties\":{\"city\":{"
                                  "\"type\":\"string\"}}}}]}");
    snprintf(body_req, sizeof body_req, auto_req, "\"pattern\":\"x\"");
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body), 200);
    free(reply);
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_int_equal(m.format, MSG_FORMAT_TEXT);
    assert_int_equal(m.n_schema, 0);
}

/* parallel_tool_calls false: the answer ends with its first call (verifyd is told to stop), the
 * second call and the text after it are not sent. */
static void one_tool_call_when_parallel_calls_are_off(void **state)
{
    (void)state;
    fake_script s = {.step = 3};
    encode("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
           "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
           "Rome\n</parameter>\n</function>\n</tool_call>\nDone, thanks for asking, and more "
           "text after the calls.",
           &s);
    const char *req =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"chat_template_kwargs\":"
        "{\"enable_thinking\":false},\"parallel_tool_calls\":false,\"tools\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]%s}";
    char body_req[1024];
    for (int stream = 0; stream < 2; stream++) {
        fake_verifyd_script(fake, &s);
        const int cancels = fake_verifyd_cancels(fake);
        snprintf(body_req, sizeof body_req, req, stream ? ",\"stream\":true" : "");
        char *reply, *body;
        int st = request("POST", "/v1/chat/completions", NULL, body_req, &reply, &body);
        if (st != 200)
            fail_msg("%d %s", st, body);
        normalize(body);
        assert_non_null(strstr(body, "Paris"));
        assert_null(strstr(body, "Rome"));
        assert_null(strstr(body, "Done"));
        assert_non_null(strstr(body, "\"finish_reason\":\"tool_calls\""));
        assert_int_equal(fake_verifyd_cancels(fake), cancels + 1);
        free(reply);
    }
}

static void reasoning_opened_by_the_prompt_is_split_off(void **state)
{
    (void)state;
    fake_script s = {.step = 5};
    encode("Let me see.\n</think>\n\nParis.", &s);
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/chat/completions", NULL,
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"capital?\"}]}",
                             &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"message\":{\"role\":\"assistant\",\"content\":\"Paris.\","
                                 "\"reasoning_content\":\"Let me see.\"}"));
    free(reply);
}

static void logprobs_of_each_token_with_alternatives(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64, 493}, .n_tokens = 2};
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/chat/completions", NULL,
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":"
                             "true,\"top_logprobs\":2,\"chat_template_kwargs\":"
                             "{\"enable_thinking\":false}}",
                             &reply, &body),
                     200);
    /* The fake gives token i log probability -0.25 (i + 1), alternative k (id + k) 1 less per k;
     * 65 is "b", 494 is "ON". */
    assert_non_null(strstr(
        body, "\"logprobs\":{\"content\":[{\"token\":\"a\",\"logprob\":-0.25,\"bytes\":[97],"
              "\"top_logprobs\":[{\"token\":\"a\",\"logprob\":-0.25,\"bytes\":[97]},{\"token\":"
              "\"b\",\"logprob\":-1.25,\"bytes\":[98]}]},{\"token\":\" pattern\",\"logprob\":"
              "-0.5,\"bytes\":[32,112,97,116,116,101,114,110],\"top_logprobs\":[{\"token\":"
              "\" pattern\",\"logprob\":-0.5,\"bytes\":[32,112,97,116,116,101,114,110]},"
              "{\"token\":\"ON\",\"logprob\":-1.5,\"bytes\":[79,78]}]}],\"refusal\":null}"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_true(m.logprobs);
    assert_int_equal(m.top_logprobs, 2);
}

static void completions_stream_with_usage(void **state)
{
    (void)state;
    fake_script s = {.step = 2};
    encode("Paris.", &s); /* 4 tokens */
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[39,68],\"max_tokens\":3,\"stream\":true,"
                             "\"stream_options\":{\"include_usage\":true}}",
                             &reply, &body),
                     200);
    normalize(body);
    const char *head = "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,"
                       "\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":0,";
    char expect[2048];
    /* max_tokens 3 cuts the fourth token: finish length. */
    snprintf(expect, sizeof expect,
             "%s\"text\":\"Par\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s\"text\":\"is\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\":null}\n\n"
             "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,\"model\":"
             "\"qwen35-tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":"
             "3,\"total_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":0},"
             "\"acceptance_length\":1.5}}\n\ndata: [DONE]\n\n",
             head, head, head);
    assert_string_equal(body, expect);
    free(reply);
}

/* n choices run one after the other, each a generation of its own (seed + i when seeded):
 * whole, the choices with their indexes and the usage summed (the prompt once, cached tokens of
 * the first); streamed, each choice's chunks under its index with its own role and finish
 * chunks, then one usage chunk and one [DONE]. */
static void n_choices_are_generated_one_after_the_other(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .cached = 1};
    encode("Paris.", &s); /* 4 tokens */
    fake_verifyd_script(fake, &s);
    const int starts = fake_verifyd_starts(fake);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[39,68],\"max_tokens\":3,\"n\":3,\"seed\":11}", &reply,
                             &body),
                     200);
    normalize(body);
    char expect[2048];
    snprintf(expect, sizeof expect,
             "{\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,\"model\":"
             "\"qwen35-tiny\",\"choices\":[{\"index\":0,\"text\":\"Paris\",\"logprobs\":null,"
             "\"finish_reason\":\"length\"},{\"index\":1,\"text\":\"Paris\",\"logprobs\":null,"
             "\"finish_reason\":\"length\"},{\"index\":2,\"text\":\"Paris\",\"logprobs\":null,"
             "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":"
             "9,\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":1},"
             "\"acceptance_length\":1.5}}");
    assert_string_equal(body, expect);
    free(reply);
    assert_int_equal(fake_verifyd_starts(fake), starts + 3);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_true(m.sampler.seed == 13); /* the third choice: 11 + 2 */

    assert_int_equal(request("POST", "/v1/chat/completions", NULL,
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":2,"
                             "\"max_tokens\":3,\"stream\":true,\"stream_options\":"
                             "{\"include_usage\":true},\"chat_template_kwargs\":"
                             "{\"enable_thinking\":false}}",
                             &reply, &body),
                     200);
    normalize(body);
    const char *head = "data: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\","
                       "\"created\":0,\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":";
    char one[1024];
    snprintf(one, sizeof one,
             "%s%%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
             "\"finish_reason\":null}],\"usage\":null}\n\n"
             "%s%%d,\"delta\":{\"content\":\"Par\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s%%d,\"delta\":{\"content\":\"is\"},\"logprobs\":null,\"finish_reason\":null}],"
             "\"usage\":null}\n\n"
             "%s%%d,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}],"
             "\"usage\":null}\n\n",
             head, head, head, head);
    char c0[1024], c1[1024], tail[4096];
    snprintf(c0, sizeof c0, one, 0, 0, 0, 0);
    snprintf(c1, sizeof c1, one, 1, 1, 1, 1);
    snprintf(tail, sizeof tail,
             "%s%sdata: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\",\"created\":0,"
             "\"model\":\"qwen35-tiny\",\"choices\":[],\"usage\":{\"prompt_tokens\":%%d,"
             "\"completion_tokens\":6,\"total_tokens\":%%d,\"prompt_tokens_details\":"
             "{\"cached_tokens\":1},\"acceptance_length\":1.5}}\n\ndata: [DONE]\n\n",
             c0, c1);
    uint32_t want[256];
    const int n_prompt = (int)expected_prompt(HI, true, want);
    char full[4096];
    snprintf(full, sizeof full, tail, n_prompt, n_prompt + 6);
    assert_string_equal(body, full);
    free(reply);
}

/* best_of: that many candidates, the n of the highest log probability per token returned, best
 * first (the fake lowers a generation's log probabilities less for a larger seed: 11, 12, 13
 * here, so the third candidate ranks first); verifyd is asked for log probabilities even when
 * the client wants none, and they are not shown then. */
static void best_of_returns_the_likeliest_candidates(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .lp_per_seed = 0.5f};
    encode("Paris.", &s); /* 4 tokens */
    fake_verifyd_script(fake, &s);
    const int starts = fake_verifyd_starts(fake);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[39,68],\"max_tokens\":1,\"n\":2,\"best_of\":3,"
                             "\"seed\":11,\"logprobs\":0}",
                             &reply, &body),
                     200);
    assert_int_equal(fake_verifyd_starts(fake), starts + 3);
    /* token 0's log probability -0.25, lowered by 0.5 (15 - seed): -1.25 (seed 13), -1.75 (12) */
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"P\",\"logprobs\":"
                                 "{\"tokens\":[\"P\"],\"token_logprobs\":[-1.25]"));
    assert_non_null(strstr(body, "{\"index\":1,\"text\":\"P\",\"logprobs\":{\"tokens\":"
                                 "[\"P\"],\"token_logprobs\":[-1.75]"));
    assert_null(strstr(body, "\"index\":2"));
    assert_non_null(strstr(body, "\"completion_tokens\":3,")); /* every candidate counts */
    free(reply);
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[39,68],\"max_tokens\":1,\"best_of\":2,\"seed\":3}",
                             &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"P\",\"logprobs\":null,"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_true(m.logprobs && m.top_logprobs == 0 && m.sampler.seed == 4);
}

/* A batch of prompts: each prompt's candidates are generated in turn (seed + i for candidate
 * i of every prompt), best_of ranks within a prompt, the choices are numbered prompt by
 * prompt, and usage sums the prompts (each one's cached tokens counted once). */
static void prompt_batches_number_the_choices_prompt_by_prompt(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .lp_per_seed = 0.5f, .cached = 1};
    encode("Paris.", &s);
    fake_verifyd_script(fake, &s);
    const int starts = fake_verifyd_starts(fake);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[[39,68],[39]],\"max_tokens\":1,\"best_of\":2,"
                             "\"seed\":11,\"logprobs\":0}",
                             &reply, &body),
                     200);
    assert_int_equal(fake_verifyd_starts(fake), starts + 4);
    /* seed 12 is each prompt's likelier candidate: -0.25 - 0.5 * (15 - 12) */
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"P\",\"logprobs\":"
                                 "{\"tokens\":[\"P\"],\"token_logprobs\":[-1.75]"));
    assert_non_null(strstr(body, "{\"index\":1,\"text\":\"P\",\"logprobs\":{\"tokens\":"
                                 "[\"P\"],\"token_logprobs\":[-1.75]"));
    assert_null(strstr(body, "\"index\":2"));
    assert_non_null(strstr(body, "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,"));
    assert_non_null(strstr(body, "\"cached_tokens\":2}"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_int_equal(m.n_prompt, 1);
    assert_int_equal(p[0], 39);
    assert_int_equal(m.sampler.seed, 12);

    /* streamed, n = 2: choices 0, 1 of the first prompt, then 2, 3 of the second */
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[\"Hello\",[39]],\"max_tokens\":1,\"n\":2,"
                             "\"stream\":true}",
                             &reply, &body),
                     200);
    normalize(body);
    const char *head = "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,"
                       "\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":";
    char expect[4096], one[512];
    expect[0] = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(one, sizeof one,
                 "%s%d,\"text\":\"P\",\"logprobs\":null,\"finish_reason\":null}]}\n\n"
                 "%s%d,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n",
                 head, i, head, i);
        strcat(expect, one);
    }
    strcat(expect, "data: [DONE]\n\n");
    assert_string_equal(body, expect);
    free(reply);
}

static void completions_stream_logprobs_ride_on_their_text(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64, 493}, .n_tokens = 2};
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":\"x\",\"logprobs\":1,\"stream\":true}", &reply, &body),
                     200);
    normalize(body);
    const char *head = "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,"
                       "\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":0,";
    char expect[2048];
    snprintf(expect, sizeof expect,
             "%s\"text\":\"a\",\"logprobs\":{\"tokens\":[\"a\"],\"token_logprobs\":[-0.25],"
             "\"top_logprobs\":[{\"a\":-0.25}],\"text_offset\":[0]},\"finish_reason\":null}]}\n\n"
             "%s\"text\":\" pattern\",\"logprobs\":{\"tokens\":[\" pattern\"],\"token_logprobs\":"
             "[-0.5],\"top_logprobs\":[{\" pattern\":-0.5}],\"text_offset\":[1]},"
             "\"finish_reason\":null}]}\n\n"
             "%s\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n"
             "data: [DONE]\n\n",
             head, head, head);
    assert_string_equal(body, expect);
    free(reply);
}

/* echo with logprobs: the text opens with the prompt ("a" " pattern" as ids), its tokens open
 * the log probabilities (the first null, the next from verifyd's PROMPT events), and the
 * offsets run on into the completion; verifyd is asked for the prompt's log probabilities. */
static void echo_opens_the_text_and_the_logprobs_with_the_prompt(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64, 493}, .n_tokens = 2};
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[64,493],\"echo\":true,\"logprobs\":1,\"max_tokens\":1}",
                             &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"a patterna\",\"logprobs\":"
                                 "{\"tokens\":[\"a\",\" pattern\",\"a\"],\"token_logprobs\":[null,"
                                 "-0.5,-0.25],\"top_logprobs\":[null,{\" pattern\":-0.5},{\"a\":"
                                 "-0.25}],\"text_offset\":[0,1,9]},\"finish_reason\":\"length\"}]"));
    assert_non_null(strstr(body, "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,"));
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_true(m.prompt_logprobs && m.logprobs && m.top_logprobs == 1 && m.max_tokens == 1);

    /* max_tokens 0: the prompt alone, given as text (kept as the client wrote it) */
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":\"Hello\",\"echo\":true,\"max_tokens\":0}", &reply,
                             &body),
                     200);
    assert_non_null(strstr(body, "\"choices\":[{\"index\":0,\"text\":\"Hello\",\"logprobs\":null,"
                                 "\"finish_reason\":\"length\"}]"));
    assert_non_null(strstr(body, "\"completion_tokens\":0,"));
    free(reply);
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_true(!m.prompt_logprobs && !m.logprobs && m.max_tokens == 0);
}

/* Streamed with n = 2: each choice's first chunk is the prompt with its log probabilities;
 * verifyd computes them for the first choice only. */
static void echo_streams_the_prompt_first_in_each_choice(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64, 493}, .n_tokens = 2};
    fake_verifyd_script(fake, &s);
    const int starts = fake_verifyd_starts(fake);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[64,493],\"echo\":true,\"logprobs\":0,\"max_tokens\":1,"
                             "\"n\":2,\"stream\":true}",
                             &reply, &body),
                     200);
    assert_int_equal(fake_verifyd_starts(fake), starts + 2);
    normalize(body);
    const char *head = "data: {\"id\":\"cmpl-X\",\"object\":\"text_completion\",\"created\":0,"
                       "\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":";
    char expect[4096], one[1024];
    expect[0] = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(one, sizeof one,
                 "%s%d,\"text\":\"a pattern\",\"logprobs\":{\"tokens\":[\"a\",\" pattern\"],"
                 "\"token_logprobs\":[null,-0.5],\"top_logprobs\":[null,{}],\"text_offset\":[0,1]},"
                 "\"finish_reason\":null}]}\n\n"
                 "%s%d,\"text\":\"a\",\"logprobs\":{\"tokens\":[\"a\"],\"token_logprobs\":[-0.25],"
                 "\"top_logprobs\":[{}],\"text_offset\":[9]},\"finish_reason\":null}]}\n\n"
                 "%s%d,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n",
                 head, i, head, i, head, i);
        strcat(expect, one);
    }
    strcat(expect, "data: [DONE]\n\n");
    assert_string_equal(body, expect);
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_false(m.prompt_logprobs); /* the second choice reused the first's */
}

/* A verifyd whose prompt log probabilities stop short fails the request with a 500 saying so. */
static void echo_with_missing_prompt_logprobs_is_an_error(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1, .prompt_lp_drop = 1};
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[64,493,64],\"echo\":true,\"logprobs\":0}", &reply,
                             &body),
                     500);
    assert_non_null(strstr(body, "The model server sent the log probabilities of 1 of the "
                                 "prompt's 2 tokens."));
    free(reply);
}

/* A prediction goes to verifyd as plain-text tokens (its text parts joined); usage tells
 * the tokens taken (as verifyd reports them) and the rest, summed over the choices. */
static void prediction_goes_to_verifyd_and_usage_counts_it(void **state)
{
    (void)state;
    fake_script s = {.step = 2, .predicted = 3};
    encode("Paris.", &s);
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("GET", "/metrics", NULL, NULL, &reply, &body), 200);
    const char *at = strstr(body, "tandem_prediction_tokens_total{outcome=\"accepted\"} ");
    assert_non_null(at);
    const int accepted_before = atoi(strchr(at, '}') + 2);
    free(reply);
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":\"x\",\"n\":2,\"prediction\":{\"type\":\"content\","
                             "\"content\":[{\"type\":\"text\",\"text\":\"a pat\"},{\"type\":"
                             "\"text\",\"text\":\"tern<|im_end|>\"}]}}",
                             &reply, &body),
                     200);
    msg_gen_start m;
    uint32_t p[256], stop[8], want[64];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    const size_t n = expected_tokens("a pattern<|im_end|>", TOK_ENC_SPLIT_SPECIAL, want, 64);
    assert_int_equal(m.n_predict, n);
    assert_memory_equal(m.predict, want, n * sizeof *want);
    uint32_t special[64]; /* the end-of-turn text is text, not the end-of-turn token */
    assert_true(expected_tokens("a pattern<|im_end|>", 0, special, 64) < n && n > 3);
    char details[160];
    snprintf(details, sizeof details, "\"completion_tokens_details\":{"
             "\"accepted_prediction_tokens\":6,\"rejected_prediction_tokens\":%zu}", 2 * (n - 3));
    assert_non_null(strstr(body, details));
    free(reply);
    char line[96]; /* and the counter, the two choices' 3 each */
    assert_int_equal(request("GET", "/metrics", NULL, NULL, &reply, &body), 200);
    snprintf(line, sizeof line, "\ntandem_prediction_tokens_total{outcome=\"accepted\"} %d\n",
             accepted_before + 6);
    assert_non_null(strstr(body, line));
    free(reply);
    /* without one, no details */
    assert_int_equal(request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply, &body),
                     200);
    assert_null(strstr(body, "completion_tokens_details"));
    free(reply);
    static const char *const bad[][2] = {
        {"{\"prompt\":\"x\",\"prediction\":\"text\"}", "Invalid type for 'prediction'"},
        {"{\"prompt\":\"x\",\"prediction\":{\"type\":\"diff\",\"content\":\"\"}}",
         "'prediction.type': supported value is 'content'"},
        {"{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\",\"content\":[{\"text\":\"a\"}]}}",
         "Only text content parts are supported; prediction.content[0] has type '(none)'."},
        {"{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\"}}",
         "Missing required parameter: 'prediction.content'"},
        {"{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\",\"content\":7}}",
         "Invalid type for 'prediction.content'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(request("POST", "/v1/completions", NULL, bad[i][0], &reply, &body), 400);
        if (!strstr(body, bad[i][1]))
            fail_msg("%s: %s", bad[i][0], body);
        free(reply);
    }
}

/* stream_options.continuous_usage_stats: every choice chunk carries the usage so far (the
 * prompt, the tokens up to that chunk), the finish chunk the whole. */
static void continuous_usage_rides_on_every_chunk(void **state)
{
    (void)state;
    fake_script s = {.step = 1};
    encode("Paris.", &s); /* 4 tokens */
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL,
                             "{\"prompt\":[39,68],\"stream\":true,\"stream_options\":{"
                             "\"include_usage\":true,\"continuous_usage_stats\":true}}",
                             &reply, &body),
                     200);
    uint32_t seen[8], n = 0;
    for (char *line = strstr(body, "data: {"); line; line = strstr(line + 1, "data: {")) {
        json_t *j = json_loadb(line + 6, strcspn(line + 6, "\n"), 0, NULL);
        assert_non_null(j);
        const json_t *u = json_object_get(j, "usage");
        assert_true(json_is_object(u));
        assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 2);
        assert_true(n < 8);
        seen[n++] = (uint32_t)json_integer_value(json_object_get(u, "completion_tokens"));
        json_decref(j);
    }
    /* 4 text chunks, the finish chunk and the usage chunk */
    assert_int_equal(n, 6);
    const uint32_t want[6] = {1, 2, 3, 4, 4, 4};
    assert_memory_equal(seen, want, sizeof want);
    free(reply);
}

/* --- failures ----------------------------------------------------------------------------------- */

static void error_in_the_middle_of_a_stream_ends_it_cleanly(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .error_after = 1, .tokens = {64, 65, 66}, .n_tokens = 3};
    fake_verifyd_script(fake, &s);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/chat/completions", NULL,
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":"
                             "true,\"chat_template_kwargs\":{\"enable_thinking\":false}}",
                             &reply, &body),
                     200);
    normalize(body);
    const char *head = "data: {\"id\":\"chatcmpl-X\",\"object\":\"chat.completion.chunk\","
                       "\"created\":0,\"model\":\"qwen35-tiny\",\"choices\":[{\"index\":0,";
    char expect[2048];
    snprintf(expect, sizeof expect,
             "%s\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
             "\"finish_reason\":null}]}\n\n"
             "%s\"delta\":{\"content\":\"a\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"
             "data: {\"error\":{\"message\":\"The generation failed: scripted failure\",\"type\":"
             "\"server_error\",\"param\":null,\"code\":\"internal_error\"}}\n\n"
             "data: [DONE]\n\n",
             head, head);
    assert_string_equal(body, expect);
    free(reply);
    /* The same failure without streaming is a 500 with the error body. */
    assert_int_equal(request("POST", "/v1/chat/completions", NULL,
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &reply,
                             &body),
                     500);
    assert_string_equal(body, "{\"error\":{\"message\":\"The generation failed: scripted failure\","
                              "\"type\":\"server_error\",\"param\":null,\"code\":"
                              "\"internal_error\"}}");
    free(reply);
}

static void busy_verifyd_is_waited_for(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .busy = 3, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(fake, &s);
    int starts = fake_verifyd_starts(fake);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply, &body),
                     200);
    assert_non_null(strstr(body, "\"text\":\"a\""));
    free(reply);
    assert_int_equal(fake_verifyd_starts(fake), starts + 1);
}

static void prompt_longer_than_the_context_is_400_with_the_numbers(void **state)
{
    (void)state;
    char req[2048] = "{\"messages\":[{\"role\":\"user\",\"content\":\"";
    for (int i = 0; i < 60; i++)
        strcat(req, "word ");
    strcat(req, "\"}],\"max_tokens\":1000}");
    char msgs[1024] = "[{\"role\":\"user\",\"content\":\"";
    for (int i = 0; i < 60; i++)
        strcat(msgs, "word ");
    strcat(msgs, "\"}]");
    uint32_t prompt[512];
    size_t n = expected_prompt(msgs, false, prompt);
    char *reply, *body;
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, req, &reply, &body), 400);
    char expect[1024];
    snprintf(expect, sizeof expect,
             "{\"error\":{\"message\":\"This model's maximum context length is 1024 tokens. "
             "However, you requested %zu tokens (%zu in the messages, 1000 in the completion). "
             "Please reduce the length of the messages or completion.\",\"type\":"
             "\"invalid_request_error\",\"param\":\"messages\",\"code\":"
             "\"context_length_exceeded\"}}",
             n + 1000, n);
    assert_string_equal(body, expect);
    free(reply);
    /* verifyd refusing a start for its context is the same kind of error. */
    fake_script s = {.start_error = TD_ERANGE};
    fake_verifyd_script(fake, &s);
    assert_int_equal(request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply, &body),
                     400);
    assert_string_equal(body, "{\"error\":{\"message\":\"prompt of too many tokens for the "
                              "context\",\"type\":\"invalid_request_error\",\"param\":\"prompt\","
                              "\"code\":\"context_length_exceeded\"}}");
    free(reply);
}

static void client_disconnect_cancels_the_generation(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .hang = true, .tokens = {64, 65}, .n_tokens = 2};
    fake_verifyd_script(fake, &s);
    int cancels = fake_verifyd_cancels(fake);
    int fd = connect_gateway();
    const char *req = "{\"prompt\":\"x\",\"stream\":true}";
    send_request(fd, "POST", "/v1/completions", NULL, req, strlen(req));
    char buf[4096];
    size_t got = 0;
    while (!strstr(buf, "\"text\":\"b\"") && got < sizeof buf - 1) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        assert_true(r > 0);
        got += (size_t)r;
        buf[got] = 0;
    }
    close(fd);
    for (int i = 0; i < 100 && fake_verifyd_cancels(fake) == cancels; i++)
        sleep_ms(20);
    assert_int_equal(fake_verifyd_cancels(fake), cancels + 1);
}

static void client_leaving_a_whole_request_cancels_it_too(void **state)
{
    (void)state;
    fake_script s = {.step = 1, .hang = true, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(fake, &s);
    int cancels = fake_verifyd_cancels(fake);
    int starts = fake_verifyd_starts(fake);
    int fd = connect_gateway();
    const char *req = "{\"prompt\":\"x\"}";
    send_request(fd, "POST", "/v1/completions", NULL, req, strlen(req));
    for (int i = 0; i < 100 && fake_verifyd_starts(fake) == starts; i++)
        sleep_ms(10);
    close(fd);
    for (int i = 0; i < 100 && fake_verifyd_cancels(fake) == cancels; i++)
        sleep_ms(20);
    assert_int_equal(fake_verifyd_cancels(fake), cancels + 1);
}

static void api_key_is_required_when_set(void **state)
{
    (void)state;
    g.cfg.api_key = "sekret";
    char *reply, *body;
    assert_int_equal(request("GET", "/v1/models", NULL, NULL, &reply, &body), 401);
    assert_non_null(strstr(reply, "WWW-Authenticate: Bearer"));
    assert_string_equal(body, "{\"error\":{\"message\":\"Missing API key: send 'Authorization: "
                              "Bearer <key>'.\",\"type\":\"authentication_error\",\"param\":null,"
                              "\"code\":\"invalid_api_key\"}}");
    free(reply);
    assert_int_equal(request("GET", "/v1/models", "Authorization: Bearer sekreT\r\n", NULL, &reply,
                             &body),
                     401);
    assert_non_null(strstr(body, "Incorrect API key provided."));
    free(reply);
    assert_int_equal(request("GET", "/v1/models", "Authorization: Bearer sekret\r\n", NULL, &reply,
                             &body),
                     200);
    free(reply);
    assert_int_equal(request("GET", "/health", NULL, NULL, &reply, &body), 200);
    assert_string_equal(body, "{\"status\":\"ok\"}");
    free(reply);
    g.cfg.api_key = NULL;
}

static void http_errors_have_openai_bodies(void **state)
{
    (void)state;
    char *reply, *body;
    assert_int_equal(request("GET", "/v2/nothing", NULL, NULL, &reply, &body), 404);
    assert_string_equal(body, "{\"error\":{\"message\":\"Unknown request URL: /v2/nothing.\","
                              "\"type\":\"invalid_request_error\",\"param\":null,\"code\":"
                              "\"not_found\"}}");
    free(reply);
    assert_int_equal(request("DELETE", "/v1/completions", NULL, NULL, &reply, &body), 405);
    assert_non_null(strstr(reply, "Allow: POST"));
    free(reply);
    char big[8192];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, big, &reply, &body), 413);
    assert_string_equal(body, "{\"error\":{\"message\":\"The request body is larger than this "
                              "server accepts (4096 bytes).\",\"type\":\"invalid_request_error\","
                              "\"param\":null,\"code\":\"request_too_large\"}}");
    free(reply);
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, "{\"messages\":", &reply,
                             &body),
                     400);
    assert_non_null(strstr(body, "\"code\":\"invalid_json\""));
    free(reply);
    assert_int_equal(request("POST", "/v1/chat/completions", NULL,
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", &reply,
                             &body),
                     400);
    assert_non_null(strstr(body, "\"code\":\"invalid_json\""));
    free(reply);
    assert_int_equal(request("POST", "/v1/chat/completions", NULL,
                             "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":"
                             "\"x\"}]}",
                             &reply, &body),
                     400);
    assert_string_equal(body, "{\"error\":{\"message\":\"The model 'gpt-4' does not exist; this "
                              "server serves 'qwen35-tiny'.\",\"type\":\"invalid_request_error\","
                              "\"param\":\"model\",\"code\":\"model_not_found\"}}");
    free(reply);
    /* The server is unharmed: a good request still works. */
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(fake, &s);
    assert_int_equal(request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply, &body),
                     200);
    free(reply);
}

static void tokenize_and_detokenize_round_trip(void **state)
{
    (void)state;
    char *reply, *body;
    assert_int_equal(request("POST", "/tokenize", NULL, "{\"content\":\"Hello world\"}", &reply,
                             &body),
                     200);
    assert_string_equal(body, "{\"count\":8,\"max_model_len\":1024,\"tokens\":[39,68,317,78,281,"
                              "274,75,67]}");
    free(reply);
    /* a chat's messages: the prompt a chat request sends verifyd, as the template makes it */
    const char *msgs = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                       "\"chat_template_kwargs\":{\"enable_thinking\":false}}";
    assert_int_equal(request("POST", "/v1/chat/completions", NULL, msgs, &reply, &body), 200);
    free(reply);
    msg_gen_start m;
    uint32_t p[256], stop[8];
    assert_true(fake_verifyd_last_start(fake, &m, p, 256, stop, 8));
    assert_int_equal(request("POST", "/tokenize", NULL, msgs, &reply, &body), 200);
    json_t *j = json_loads(body, 0, NULL);
    const json_t *toks = json_object_get(j, "tokens");
    assert_int_equal(json_array_size(toks), m.n_prompt);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), m.n_prompt);
    for (uint32_t i = 0; i < m.n_prompt; i++)
        assert_int_equal(json_integer_value(json_array_get(toks, i)), p[i]);
    json_decref(j);
    free(reply);
    assert_int_equal(request("POST", "/tokenize", NULL, "{\"messages\":[{\"role\":\"x\"}]}",
                             &reply, &body),
                     400);
    free(reply);
    assert_int_equal(request("POST", "/detokenize", NULL,
                             "{\"tokens\":[505,39,68,317,78,281,274,75,67]}", &reply, &body),
                     200);
    assert_string_equal(body, "{\"content\":\"<|im_start|>Hello world\"}");
    free(reply);
}

static void metrics_show_gateway_and_verifyd_numbers(void **state)
{
    (void)state;
    char *reply, *body;
    assert_int_equal(request("GET", "/metrics", NULL, NULL, &reply, &body), 200);
    assert_non_null(strstr(reply, "Content-Type: text/plain; version=0.0.4"));
    const char *lines[] = {
        "\ntandem_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} ",
        "\ntandem_requests_total{endpoint=\"/v1/completions\",status=\"405\"} 1\n",
        "\ntandem_requests_total{endpoint=\"other\",status=\"404\"} 1\n",
        "\ntandem_verifyd_up 1\n",
        "\ntandem_verifyd_ready 1\n",
        /* the fake's histogram: 5 steps of 1 token, 2 of 2 */
        "\ntandem_acceptance_length_bucket{le=\"1\"} 5\n",
        "\ntandem_acceptance_length_bucket{le=\"2\"} 7\n",
        "\ntandem_acceptance_length_bucket{le=\"+Inf\"} 7\n",
        "\ntandem_acceptance_length_sum 9\n",
        "\ntandem_verify_seconds_total 3.000000\n",
        "\ntandem_draft_seconds_total 1.500000\n",
        "\ntandem_decode_tokens_per_second 2.000\n",
        "\ntandem_draftd_restarts_total 1\n",
        "\ntandem_queue_depth 1\n",
        "\ntandem_requests_running 0\n",
        "\ntandem_prediction_tokens_total{outcome=\"accepted\"} ",
        "\ntandem_tool_calls_total ",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        if (!strstr(body, lines[i]))
            fail_msg("missing in /metrics: %s", lines[i] + 1);
    free(reply);
}

/* Opens a completions stream on a generation that never ends and returns the socket. */
static int open_hanging_stream(void)
{
    fake_script s = {.step = 1, .hang = true, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(fake, &s);
    int fd = connect_gateway();
    const char *req = "{\"prompt\":\"x\",\"stream\":true}";
    send_request(fd, "POST", "/v1/completions", NULL, req, strlen(req));
    return fd;
}

static void verifyd_restart_between_polls_ends_open_streams(void **state)
{
    (void)state;
    int fd = open_hanging_stream();
    sleep_ms(300);
    /* A new verifyd process knows nothing of the old one's generations. */
    fake_verifyd_set_pid(fake, 2222);
    char *reply, *body;
    assert_int_equal(read_reply(fd, &reply, &body), 200);
    assert_non_null(strstr(body, "\"text\":\"a\""));
    assert_non_null(strstr(body, "data: {\"error\":{\"message\":\"The generation failed: verifyd "
                                 "restarted during the generation\",\"type\":\"server_error\","
                                 "\"param\":null,\"code\":\"backend_unavailable\"}}\n\n"
                                 "data: [DONE]\n\n"));
    free(reply);
}

/* Last: stops the fake. A verifyd that dies ends open streams at once (its event connection
 * closes), /health says 503, requests get 503, and all is well once it is back. */
static void verifyd_gone_ends_open_streams_at_once(void **state)
{
    (void)state;
    int fd = open_hanging_stream();
    sleep_ms(300);
    fake_verifyd_stop(fake);
    fake = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char *reply, *body;
    assert_int_equal(read_reply(fd, &reply, &body), 200);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    /* Well before the 3 s without answers that would count as down otherwise. */
    assert_true((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 < 2000);
    assert_non_null(strstr(body, "data: {\"error\":{\"message\":\"The generation failed: verifyd "
                                 "stopped answering during the generation\",\"type\":"
                                 "\"server_error\",\"param\":null,\"code\":"
                                 "\"backend_unavailable\"}}\n\ndata: [DONE]\n\n"));
    free(reply);
    wait_health(503);
    assert_int_equal(request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply, &body),
                     503);
    assert_non_null(strstr(body, "\"code\":\"backend_unavailable\""));
    free(reply);
    assert_int_equal(fake_verifyd_start(&fake, verifyd_url, events_url, 3333, N_CTX, true), TD_OK);
    wait_health(200);
    fake_script s = {.step = 1, .tokens = {64}, .n_tokens = 1};
    fake_verifyd_script(fake, &s);
    assert_int_equal(request("POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &reply, &body),
                     200);
    free(reply);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chat_whole_response_and_what_verifyd_receives),
        cmocka_unit_test(chat_stream_sends_exact_chunks),
        cmocka_unit_test(stop_string_ends_the_text_and_cancels_verifyd),
        cmocka_unit_test(tool_call_in_the_output_becomes_tool_calls),
        cmocka_unit_test(required_call_sends_the_tool_spec),
        cmocka_unit_test(one_tool_call_when_parallel_calls_are_off),
        cmocka_unit_test(reasoning_opened_by_the_prompt_is_split_off),
        cmocka_unit_test(logprobs_of_each_token_with_alternatives),
        cmocka_unit_test(completions_stream_with_usage),
        cmocka_unit_test(n_choices_are_generated_one_after_the_other),
        cmocka_unit_test(best_of_returns_the_likeliest_candidates),
        cmocka_unit_test(completions_stream_logprobs_ride_on_their_text),
        cmocka_unit_test(prompt_batches_number_the_choices_prompt_by_prompt),
        cmocka_unit_test(prediction_goes_to_verifyd_and_usage_counts_it),
        cmocka_unit_test(continuous_usage_rides_on_every_chunk),
        cmocka_unit_test(echo_opens_the_text_and_the_logprobs_with_the_prompt),
        cmocka_unit_test(echo_streams_the_prompt_first_in_each_choice),
        cmocka_unit_test(echo_with_missing_prompt_logprobs_is_an_error),
        cmocka_unit_test(error_in_the_middle_of_a_stream_ends_it_cleanly),
        cmocka_unit_test(busy_verifyd_is_waited_for),
        cmocka_unit_test(prompt_longer_than_the_context_is_400_with_the_numbers),
        cmocka_unit_test(client_disconnect_cancels_the_generation),
        cmocka_unit_test(client_leaving_a_whole_request_cancels_it_too),
        cmocka_unit_test(api_key_is_required_when_set),
        cmocka_unit_test(http_errors_have_openai_bodies),
        cmocka_unit_test(tokenize_and_detokenize_round_trip),
        cmocka_unit_test(metrics_show_gateway_and_verifyd_numbers),
        cmocka_unit_test(verifyd_restart_between_polls_ends_open_streams),
        cmocka_unit_test(verifyd_gone_ends_open_streams_at_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
