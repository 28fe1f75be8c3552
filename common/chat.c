#include "common/chat.h"

#include <stdlib.h>
#include <string.h>

#include "common/jinja.h"

struct chat_template {
    jinja_tmpl *jt;
    bool reads_content; /* the text names "content" (continue_final needs it) */
};

td_err chat_template_init(chat_template **out, const char *text, size_t len)
{
    *out = NULL;
    chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(TD_ENOMEM, "chat template: out of memory");
    td_err e = jinja_compile(&t->jt, text, len);
    if (e != TD_OK) {
        free(t);
        return e;
    }
    t->reads_content = memmem(text, len, "content", 7) != NULL;
    *out = t;
    return TD_OK;
}

void chat_template_free(chat_template *t)
{
    if (!t)
        return;
    jinja_free(t->jt);
    free(t);
}

/* The reasoning of a message under the names transformers accepts, first one set wins. */
static json_t *message_reasoning(const json_t *m)
{
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(m, fields[i]);
        if (v && !json_is_null(v))
            return v;
    }
    return NULL;
}

/* transformers' _normalize_chat_messages + _alias_reasoning_fields on one message. */
static td_err message_normalize(const json_t *m, size_t index, json_t **out)
{
    if (!json_is_object(m))
        return err_set(TD_EINVAL, "message %zu: chat messages should be JSON objects", index);
    json_t *r = json_object();
    if (!r)
        return err_set(TD_ENOMEM, "chat template: out of memory");
    json_t *reasoning = message_reasoning(m);
    if (reasoning)
        json_object_set(r, "thinking", reasoning);
    const char *k;
    size_t kn;
    json_t *v;
    json_object_keylen_foreach((json_t *)m, k, kn, v) {
        if (!json_is_null(v))
            json_object_setn(r, k, kn, v);
    }
    if (reasoning)
        json_object_set(r, "reasoning_content", reasoning);
    *out = r;
    return TD_OK;
}

static td_err build_vars(const json_t *messages, const chat_opts *o, json_t *vars)
{
    if (!json_is_array(messages))
        return err_set(TD_EINVAL, "chat messages must be a JSON array");
    if (json_array_size(messages) == 0)
        return err_set(TD_EINVAL, "Cannot apply chat template to an empty conversation. Provide at least one message.");
    if (o->tools && !json_is_array(o->tools) && !json_is_null(o->tools))
        return err_set(TD_EINVAL, "tools must be a JSON array");
    if (o->kwargs && !json_is_object(o->kwargs))
        return err_set(TD_EINVAL, "template keyword variables must be a JSON object");
    json_t *msgs = json_array();
    json_object_set_new(vars, "messages", msgs);
    for (size_t i = 0; i < json_array_size(messages); i++) {
        json_t *m = NULL;
        TD_TRY(message_normalize(json_array_get(messages, i), i, &m));
        json_array_append_new(msgs, m);
    }
    for (size_t i = 0; o->tools && i < json_array_size(o->tools); i++)
        if (!json_is_object(json_array_get(o->tools, i)))
            return err_set(TD_EINVAL, "tool %zu: tools should be JSON schemas (objects)", i);
    json_object_set_new(vars, "tools", o->tools ? json_deep_copy(o->tools) : json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(o->add_generation_prompt));
    if (o->bos_token)
        json_object_set_new(vars, "bos_token", json_string(o->bos_token));
    if (o->eos_token)
        json_object_set_new(vars, "eos_token", json_string(o->eos_token));
    if (o->kwargs) {
        static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt"};
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)o->kwargs, k, v) {
            for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
                if (!strcmp(k, reserved[i]))
                    return err_set(TD_EINVAL, "template keyword variable '%s' is set by the chat itself", k);
            json_object_set(vars, k, v);
        }
    }
    if (o->enable_thinking != CHAT_THINK_UNSET)
        json_object_set_new(vars, "enable_thinking", json_boolean(o->enable_thinking == CHAT_THINK_ON));
    return TD_OK;
}

/* continue_final: the final message's text (its content, or the last part of it with a
 * "text") gets CONTINUE_MARK appended in the copy that is rendered, so that the prompt can be
 * cut where the message ends whatever the template does around it (as transformers does). */
#define CONTINUE_MARK "TANDEMCONTINUEMARK "
#define CONTINUE_MARK_LEN (sizeof CONTINUE_MARK - 1)

static json_t *marked(const json_t *text)
{
    const size_t n = json_string_length(text);
    char *s = malloc(n + CONTINUE_MARK_LEN);
    if (!s)
        return NULL;
    memcpy(s, json_string_value(text), n);
    memcpy(s + n, CONTINUE_MARK, CONTINUE_MARK_LEN);
    json_t *r = json_stringn(s, n + CONTINUE_MARK_LEN);
    free(s);
    return r;
}

/* Marks the final message of the normalised messages; *text gets its text (unmarked, a
 * reference of the caller's). */
static td_err mark_final(json_t *msgs, const json_t **text)
{
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    json_t *content = json_object_get(last, "content");
    if (!content)
        return err_set(TD_EINVAL, "continue_final_message: the final message has no content to "
                                  "continue");
    json_t *copy = NULL, *part = NULL;
    if (json_is_array(content)) { /* the last part with a "text" */
        for (size_t i = json_array_size(content); i-- > 0 && !part;)
            if (json_object_get(json_array_get(content, i), "text")) {
                if (!(copy = json_deep_copy(content)))
                    return err_set(TD_ENOMEM, "chat template: out of memory");
                part = json_array_get(copy, i);
            }
        if (!part)
            return err_set(TD_EINVAL, "continue_final_message: the final message has no text "
                                      "part to continue");
        content = json_object_get(part, "text");
    }
    if (!json_is_string(content)) {
        json_decref(copy);
        return err_set(TD_EINVAL, "continue_final_message: the final message's text is not a "
                                  "string");
    }
    *text = json_incref(content);
    json_t *m = marked(content);
    if (!m || (part ? json_object_set_new(part, "text", m) : json_object_set_new(last, "content", m))) {
        json_decref(copy);
        return err_set(TD_ENOMEM, "chat template: out of memory");
    }
    if (copy && json_object_set_new(last, "content", copy))
        return err_set(TD_ENOMEM, "chat template: out of memory");
    return TD_OK;
}

/* The last occurrence of needle[0, k) in s[0, n), or -1. */
static ptrdiff_t last_index(const char *s, size_t n, const char *needle, size_t k)
{
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (!memcmp(s + i, needle, k))
            return (ptrdiff_t)i;
    return -1;
}

/* The rendered prompt cut where the final message's text ends (the mark, and any space the
 * template trimmed from it). */
static td_err cut_at_mark(char *out, size_t *len, const json_t *text)
{
    size_t a;
    const char *s = json_string_value(text);
    const size_t b = jinja_py_strip(s, json_string_length(text), true, true, &a);
    const ptrdiff_t at = last_index(out, *len, CONTINUE_MARK, CONTINUE_MARK_LEN - 1);
    if (at < 0 || (b > a && !memmem(out, *len, s + a, b - a)))
        return err_set(TD_EINVAL, "continue_final_message: the chat template does not keep the "
                                  "final message's text whole, so it cannot be continued");
    size_t end = (size_t)at;
    if ((size_t)at + CONTINUE_MARK_LEN > *len || memcmp(out + at, CONTINUE_MARK, CONTINUE_MARK_LEN))
        end = jinja_py_strip(out, end, false, true, &a); /* the template trimmed the text */
    out[end] = '\0';
    *len = end;
    return TD_OK;
}

td_err chat_template_render(const chat_template *t, const json_t *messages, const chat_opts *o,
                            char **out, size_t *out_len)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    chat_opts none = {0};
    if (!o)
        o = &none;
    if (o->continue_final && o->add_generation_prompt)
        return err_set(TD_EINVAL, "continue_final_message and add_generation_prompt cannot both "
                                  "be set: one continues the final message, the other opens a "
                                  "new one");
    if (o->continue_final && !t->reads_content)
        return err_set(TD_EINVAL, "continue_final_message: the chat template never reads a "
                                  "message's content");
    json_t *vars = json_object();
    if (!vars)
        return err_set(TD_ENOMEM, "chat template: out of memory");
    const json_t *text = NULL;
    size_t len = 0;
    td_err e = build_vars(messages, o, vars);
    if (e == TD_OK && o->continue_final)
        e = mark_final(json_object_get(vars, "messages"), &text);
    if (e == TD_OK)
        e = jinja_render(t->jt, vars, o->limits, out, &len, NULL);
    if (e == TD_OK && o->continue_final && (e = cut_at_mark(*out, &len, text)) != TD_OK) {
        free(*out);
        *out = NULL;
        len = 0;
    }
    if (out_len)
        *out_len = len;
    json_decref((json_t *)text);
    json_decref(vars);
    return e;
}

td_err chat_render(const char *text, size_t len, const json_t *messages, const chat_opts *o,
                   char **out, size_t *out_len)
{
    *out = NULL;
    chat_template *t;
    TD_TRY(chat_template_init(&t, text, len));
    td_err e = chat_template_render(t, messages, o, out, out_len);
    chat_template_free(t);
    return e;
}

/* The text of the token whose id is under key, or NULL when either is absent. */
static char *model_token(const gguf_file *g, const char *key)
{
    uint32_t id;
    const gguf_value *tokens;
    gguf_str s;
    if (gguf_get_u32(g, key, &id) != TD_OK || gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens) != TD_OK ||
        gguf_arr_str(tokens, id, &s) != TD_OK)
        return NULL;
    return strndup(s.ptr, s.len);
}

td_err chat_model_load(chat_model *m, const gguf_file *g)
{
    memset(m, 0, sizeof *m);
    gguf_str s;
    td_err e = gguf_get_str(g, "tokenizer.chat_template", &s);
    if (e == TD_ENOENT)
        return err_set(TD_ENOENT, "the model has no tokenizer.chat_template");
    TD_TRY(e);
    m->template_text = malloc(s.len + 1);
    if (!m->template_text)
        return err_set(TD_ENOMEM, "chat template: out of memory");
    memcpy(m->template_text, s.ptr, s.len);
    m->template_text[s.len] = '\0';
    m->template_len = s.len;
    bool add_bos = true;
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) != TD_OK)
        add_bos = true;
    if (add_bos)
        m->bos_token = model_token(g, "tokenizer.ggml.bos_token_id");
    m->eos_token = model_token(g, "tokenizer.ggml.eos_token_id");
    return TD_OK;
}

void chat_model_free(chat_model *m)
{
    free(m->template_text);
    free(m->bos_token);
    free(m->eos_token);
    memset(m, 0, sizeof *m);
}
