/* Fuzzes the Jinja interpreter with template text: any input either fails to compile with a
 * message or renders against a chat-like set of variables within small limits, returning text
 * no longer than max_output or an error with a message; never a crash, a hang or a leak. A
 * template that compiles also renders as a chat template continuing the final message
 * (chat_template_render, continue_final): a prompt no longer than the limit plus the text's
 * mark, or an error with a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/chat.h"
#include "common/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fuzz_vars[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"h\\u00e9llo <tool_response>\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>r</think>a\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
    "\"arguments\":{\"a\":[1,2.5,null,true],\"b\":{\"c\":\"d\"}}}}]},{\"role\":\"tool\",\"content\":\"ok\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"t\"},{\"type\":\"image\"}]}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d \\ud83d\\ude00\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\"}}}}}],"
    "\"add_generation_prompt\":true,\"enable_thinking\":false,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\","
    "\"xs\":[3,1,2],\"n\":null,\"f\":-0.5,\"big\":9223372036854775807,\"s\":\"\\u0000x\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars;
    if (!vars) {
        json_error_t je;
        vars = json_loads(fuzz_vars, JSON_ALLOW_NUL, &je);
        if (!vars)
            abort();
    }
    jinja_tmpl *t;
    if (jinja_compile(&t, (const char *)data, size) != TD_OK) {
        if (!err_msg()[0])
            abort();
        return 0;
    }
    jinja_limits lim = {
        .max_output = 1 << 16,
        .max_memory = (size_t)16 << 20,
        .max_steps = 200000,
        .max_depth = 64,
    };
    char *out;
    size_t n;
    /* a render error's message may be empty: raise_exception('') says exactly that */
    if (jinja_render(t, vars, &lim, &out, &n, NULL) == TD_OK) {
        if (n > lim.max_output || strlen(out) > n)
            abort();
        free(out);
    }
    jinja_free(t);
    chat_template *ct;
    if (chat_template_init(&ct, (const char *)data, size) != TD_OK)
        abort(); /* it compiled above */
    const chat_opts o = {.continue_final = true, .limits = &lim};
    if (chat_template_render(ct, json_object_get(vars, "messages"), &o, &out, &n) == TD_OK) {
        if (n > lim.max_output + 64 || strlen(out) > n)
            abort();
        free(out);
    } else if (out || n) { /* a failed render leaves nothing behind */
        abort();
    }
    chat_template_free(ct);
    return 0;
}
