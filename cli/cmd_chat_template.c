/* tandem chat-template: renders a chat with a model's chat template, exactly as the gateway
 * builds a prompt, and prints it as it is (no newline added).
 *
 *   tandem chat-template --template T.jinja --messages chat.json
 *   tandem chat-template --model M.gguf [--messages FILE|-] [--tools FILE]
 *                        [--no-generation-prompt] [--continue-final-message]
 *                        [--enable-thinking true|false]
 *                        [--kwargs JSON] [--bos-token S] [--eos-token S]
 *
 * The messages file holds a JSON array of messages (stdin by default), or a whole chat
 * completions request body, whose "messages" and "tools" are used (--tools still wins); the
 * tools file holds a JSON array of tool schemas. With --model the template and the BOS/EOS texts come from the file
 * (chat_model_load); --bos-token/--eos-token set or override them.
 * A failure (raise_exception in the template included) prints "tandem chat-template: MESSAGE"
 * on stderr and exits 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli_file.h"
#include "cli/cmd.h"
#include "common/args.h"
#include "common/chat.h"
#include "common/gguf.h"


static int ct_fail(const char *msg)
{
    fprintf(stderr, "tandem chat-template: %s\n", msg);
    return 1;
}

static td_err ct_parse_json(const char *what, const char *text, size_t len, json_t **out)
{
    json_error_t je;
    *out = json_loadb(text, len, JSON_ALLOW_NUL, &je);
    if (!*out)
        return err_set(TD_EINVAL, "%s: invalid JSON at line %d column %d: %s", what, je.line, je.column, je.text);
    return TD_OK;
}

static td_err ct_read_json(const char *path, json_t **out)
{
    char *text;
    size_t len;
    TD_TRY(cli_read_file(path, &text, &len));
    td_err e = ct_parse_json(path, text, len, out);
    free(text);
    return e;
}

static td_err ct_load_model(const char *path, chat_model *m)
{
    gguf_file *g;
    TD_TRY(gguf_open(&g, path));
    td_err e = chat_model_load(m, g);
    gguf_close(g);
    if (e != TD_OK)
        return err_wrap(e, "%s", path);
    return TD_OK;
}

int cmd_chat_template(int argc, char **argv)
{
    const char *template_path = NULL, *model = NULL, *messages_path = "-", *tools_path = NULL;
    const char *thinking = NULL, *kwargs_text = NULL, *bos = NULL, *eos = NULL;
    bool no_gen = false, cont = false, help = false;
    const args_opt opts[] = {
        {.name = "template", .type = ARGS_STRING, .value = &template_path, .help = "Jinja chat template file"},
        {.name = "model", .type = ARGS_STRING, .value = &model, .help = "GGUF model file (its tokenizer.chat_template)"},
        {.name = "messages", .type = ARGS_STRING, .value = &messages_path, .help = "JSON array of messages or a request body, - for stdin"},
        {.name = "tools", .type = ARGS_STRING, .value = &tools_path, .help = "JSON array of tool schemas"},
        {.name = "no-generation-prompt", .type = ARGS_FLAG, .value = &no_gen, .help = "do not open the assistant's turn"},
        {.name = "continue-final-message", .type = ARGS_FLAG, .value = &cont, .help = "end with the final message's text, left open (with --no-generation-prompt)"},
        {.name = "enable-thinking", .type = ARGS_STRING, .value = &thinking, .help = "true or false (unset: the template's default)"},
        {.name = "kwargs", .type = ARGS_STRING, .value = &kwargs_text, .help = "JSON object of extra template variables"},
        {.name = "bos-token", .type = ARGS_STRING, .value = &bos, .help = "BOS text (bos_token)"},
        {.name = "eos-token", .type = ARGS_STRING, .value = &eos, .help = "EOS text (eos_token)"},
        ARGS_END,
    };
    const char *usage = "tandem chat-template (--template FILE | --model M.gguf) [--messages FILE|-] "
                        "[--tools FILE] [--no-generation-prompt] [--continue-final-message] [--enable-thinking true|false] "
                        "[--kwargs JSON]";
    if (args_parse(argc, argv, 1, opts, NULL, 0, NULL, &help) != TD_OK) {
        fprintf(stderr, "tandem chat-template: %s\n", err_msg());
        args_usage(usage, opts);
        return 2;
    }
    if (help) {
        args_usage(usage, opts);
        return 0;
    }
    if (!template_path == !model) {
        fprintf(stderr, "tandem chat-template: give exactly one of --template and --model\n");
        return 2;
    }
    chat_opts o = {.add_generation_prompt = !no_gen, .continue_final = cont};
    if (thinking) {
        if (!strcmp(thinking, "true"))
            o.enable_thinking = CHAT_THINK_ON;
        else if (!strcmp(thinking, "false"))
            o.enable_thinking = CHAT_THINK_OFF;
        else {
            fprintf(stderr, "tandem chat-template: --enable-thinking: expected true or false, got '%s'\n", thinking);
            return 2;
        }
    }

    chat_model in = {0};
    json_t *messages = NULL, *tools = NULL, *kwargs = NULL;
    char *out = NULL;
    size_t out_len = 0;
    td_err e = template_path ? cli_read_file(template_path, &in.template_text, &in.template_len)
                             : ct_load_model(model, &in);
    if (e == TD_OK)
        e = ct_read_json(messages_path, &messages);
    if (e == TD_OK && json_is_object(messages)) { /* a request body */
        json_t *body = messages;
        messages = json_incref(json_object_get(body, "messages"));
        if (!tools_path)
            tools = json_incref(json_object_get(body, "tools"));
        json_decref(body);
        if (!messages)
            e = err_set(TD_EINVAL, "%s: the request has no \"messages\"", messages_path);
    }
    if (e == TD_OK && tools_path)
        e = ct_read_json(tools_path, &tools);
    if (e == TD_OK && kwargs_text)
        e = ct_parse_json("--kwargs", kwargs_text, strlen(kwargs_text), &kwargs);
    if (e == TD_OK) {
        o.tools = tools;
        o.kwargs = kwargs;
        o.bos_token = bos ? bos : in.bos_token;
        o.eos_token = eos ? eos : in.eos_token;
        e = chat_render(in.template_text, in.template_len, messages, &o, &out, &out_len);
    }
    int rc = 0;
    if (e != TD_OK)
        rc = ct_fail(err_msg());
    else if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout) != 0)
        rc = ct_fail("writing the output failed");
    free(out);
    json_decref(messages);
    json_decref(tools);
    json_decref(kwargs);
    chat_model_free(&in);
    return rc;
}
