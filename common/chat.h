/* Chat templates: OpenAI-style messages -> the prompt text the model was trained on.
 *
 * The template is the model's Jinja text (GGUF `tokenizer.chat_template`), rendered with the
 * variables Hugging Face transformers' apply_chat_template passes, after the same message
 * clean-up, so the prompt equals transformers' byte for byte:
 *   messages               the messages, each with its null-valued keys dropped, and when one
 *                          of reasoning_content / thinking / reasoning is set, `thinking` first
 *                          and `reasoning_content` filled with that value
 *   tools                  the tool schemas, or none
 *   documents              none
 *   add_generation_prompt  bool
 *   bos_token, eos_token   when the model has them
 *   enable_thinking        only when set
 *   + the extra keyword variables (which may override bos_token / eos_token). */
#ifndef TANDEM_COMMON_CHAT_H
#define TANDEM_COMMON_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/jinja.h"

typedef enum chat_think {
    CHAT_THINK_UNSET = 0, /* the template's default (no enable_thinking variable) */
    CHAT_THINK_ON,
    CHAT_THINK_OFF,
} chat_think;

typedef struct chat_opts {
    const json_t *tools;        /* JSON array of tool schemas (OpenAI function tools), or NULL */
    bool add_generation_prompt; /* end with the assistant turn's opening */
    bool continue_final;        /* end with the final message's text, left open for the model
                                   to go on (transformers' continue_final_message; not with
                                   add_generation_prompt) */
    chat_think enable_thinking;
    const json_t *kwargs;       /* JSON object of extra template variables, or NULL */
    const char *bos_token;      /* the model's BOS text, or NULL when it has none */
    const char *eos_token;      /* the model's EOS text, or NULL */
    const jinja_limits *limits; /* bounds on the render, or NULL for jinja_limits_default */
} chat_opts;

/* What a GGUF model file says about chatting with it. */
typedef struct chat_model {
    char *template_text; /* tokenizer.chat_template, NUL-terminated */
    size_t template_len; /* bytes */
    char *bos_token;     /* text of tokenizer.ggml.bos_token_id, or NULL (see chat_model_load) */
    char *eos_token;     /* text of tokenizer.ggml.eos_token_id, or NULL */
} chat_model;

/* Reads the template and special-token texts of a model file. TD_ENOENT when it has no
 * tokenizer.chat_template. llama.cpp's converter writes a bos_token_id even for models whose
 * Hugging Face tokenizer has no BOS token (Qwen), marking them add_bos_token = false, so the
 * BOS text is given only when add_bos_token is absent or true: that is when transformers'
 * special_tokens_map has one. */
td_err chat_model_load(chat_model *m, const gguf_file *g);
void chat_model_free(chat_model *m);

typedef struct chat_template chat_template;

/* Parses a template once for many renders. Errors: TD_EFORMAT / TD_ENOTSUP with the line
 * ("template line 3: ..."). */
td_err chat_template_init(chat_template **out, const char *text, size_t len);
void chat_template_free(chat_template *t);

/* Renders messages (a JSON array of message objects) into a malloc'd NUL-terminated prompt of
 * *out_len bytes. A template's raise_exception('...') fails with TD_EINVAL and exactly that
 * message in err_msg(); other template failures carry jinja2's message (TD_EINVAL) or name
 * the exceeded limit (TD_ERANGE); bad arguments are TD_EINVAL. */
td_err chat_template_render(const chat_template *t, const json_t *messages, const chat_opts *o,
                            char **out, size_t *out_len);

/* chat_template_init + chat_template_render + chat_template_free. */
td_err chat_render(const char *text, size_t len, const json_t *messages, const chat_opts *o,
                   char **out, size_t *out_len);

#endif
