#include "common/chat.h"

#include <stdlib.h>
#include <string.h>

#include "common/jinja.h"

struct chat_template {
    jinja_tmpl *jt;
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

td_err chat_template_render(const chat_template *t, const json_t *messages, const chat_opts *o,
                            char **out, size_t *out_len)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    chat_opts none = {0};
    if (!o)
        o = &none;
    json_t *vars = json_object();
    if (!vars)
        return err_set(TD_ENOMEM, "chat template: out of memory");
    td_err e = build_vars(messages, o, vars);
    if (e == TD_OK)
        e = jinja_render(t->jt, vars, o->limits, out, out_len, NULL);
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
