/* OpenAI requests: the JSON bodies of /v1/chat/completions, /v1/completions, /v1/responses
 * (as the chat request it stands for), /tokenize and /detokenize, parsed and checked before
 * anything reaches the backend.
 *
 * Checks follow the OpenAI API: each known field must have its type and range, `n` is
 * 1..REQ_N_MAX, `top_logprobs` needs `logprobs`, `stream_options` needs `stream`;
 * unknown fields are ignored, since clients send extras. A failure fills an api_error whose
 * message names the field (param) and says what was expected, e.g.
 * "Invalid type for 'max_tokens': expected an integer, but got a string instead."
 * Invalid UTF-8 never gets this far: jansson refuses it while parsing the body. */
#ifndef TANDEM_GATEWAY_REQUEST_H
#define TANDEM_GATEWAY_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/chat.h"
#include "common/err.h"
#include "common/msg.h"
#include "gateway/apierr.h"

#define REQ_STOP_MAX 16           /* stop strings per request */
#define REQ_STOP_LEN_MAX 1024     /* bytes per stop string */
#define REQ_BAD_WORDS_MAX 128     /* bad_words per request */
#define REQ_BAD_WORD_LEN_MAX 256  /* bytes per bad word */
#define REQ_TOP_LOGPROBS_MAX 20   /* alternatives per token, as OpenAI allows */
#define REQ_BIAS_MAX 1024         /* logit_bias entries */
#define REQ_STOP_IDS_MAX 32       /* stop_token_ids entries */
#define REQ_N_MAX 128             /* choices per request (OpenAI's limit) */
#define REQ_PROMPTS_MAX 128       /* prompts of a completions batch */
#define REQ_GENERATIONS_MAX 1024  /* prompts x best_of (or n) per request */

typedef enum req_kind {
    REQ_CHAT = 1,   /* /v1/chat/completions */
    REQ_COMPLETION, /* /v1/completions */
    REQ_RESPONSES,  /* /v1/responses: parsed into a REQ_CHAT request with responses set */
} req_kind;

typedef struct req_sampling {
    double temperature; /* >= 0; 0 = greedy; default 1 as OpenAI */
    double top_p;       /* in (0, 1]; 1 = off */
    int64_t top_k;      /* candidates kept, 0 = all (-1 from a client means 0) */
    double min_p;       /* in [0, 1]; 0 = off */
    bool has_seed;      /* the client gave a seed */
    uint64_t seed;      /* sampling seed when has_seed */
    double presence_penalty;  /* in [-2, 2]: minus this for a token generated before */
    double frequency_penalty; /* in [-2, 2]: and this much per time it was generated */
    double repetition_penalty; /* in (0, MSG_REPETITION_MAX]; 1 = off (vLLM's): a prompt or
                                * generated token's positive logit is divided by it, a
                                * negative one multiplied */
    int64_t min_tokens;       /* >= 0 (vLLM's): no stop token before this many tokens */
} req_sampling;

/* One completions prompt: text or token ids. */
typedef struct req_prompt {
    const char *text;    /* UTF-8 text in root, or NULL when given as ids */
    size_t len;          /* bytes, >= 1 */
    int32_t *ids;        /* owned: [n_ids] when given as ids, else NULL */
    size_t n_ids;        /* tokens, >= 1 */
} req_prompt;

typedef struct gw_request {
    req_kind kind;
    json_t *root;        /* the parsed body; owns every string below */
    bool responses;      /* a /v1/responses request, run as the chat request (root) it makes */
    json_t *resp;        /* owned: responses: the client's body, whose settings the response
                          * object repeats; else NULL */
    json_t *resp_conv;   /* owned: responses: the conversation as chat messages, the previous
                          * response's first, without the instructions; else NULL */
    bool resp_keep;      /* responses: keep the response (`store`, and a store exists) */
    bool background;     /* responses: run in the background (`background`; needs resp_keep) */
    const char *model;   /* requested model name, or NULL when absent */

    /* chat */
    json_t *messages;    /* owned: the messages as the chat template wants them (developer
                            -> system, text parts joined, tool-call arguments as objects) */
    const json_t *tools; /* the tool schemas (array in root), or NULL */
    bool parse_tools;    /* tools given and tool_choice is not "none" */
    bool force_call;     /* tool_choice "required" or a named function: the answer opens with
                            a tool call (format MSG_FORMAT_TOOL_CALL) */
    json_t *named_tools; /* owned: [the named function's tool] (tools points here), or NULL */
    bool parallel_calls; /* parallel_tool_calls (default true); false: the answer ends with its
                            first tool call */
    bool add_generation_prompt;   /* default true */
    bool continue_final;          /* continue_final_message: the prompt ends with the final
                                     message's text, which the output continues */
    chat_think enable_thinking;   /* from chat_template_kwargs.enable_thinking */
    const json_t *template_kwargs; /* chat_template_kwargs object in root, or NULL */
    const char *chat_template;     /* vLLM's chat_template: this request's Jinja template (in
                                    * root, [chat_template_len] bytes) instead of the model's,
                                    * or NULL */
    size_t chat_template_len;

    /* completion: the prompts, 1..REQ_PROMPTS_MAX; each gets n choices (best_of candidates),
     * numbered prompt by prompt */
    req_prompt *prompts;   /* owned: [n_prompts] */
    size_t n_prompts;
    bool echo;             /* each choice's text opens with the prompt (and its tokens' log
                            * probabilities with logprobs, the first one null); max_tokens may
                            * then be 0. Chat (vLLM's): each choice's content opens with the
                            * last message's text when that message is the assistant's */

    /* both */
    uint32_t n;            /* choices, 1..REQ_N_MAX, generated one after the other */
    uint32_t best_of;      /* completions: candidates generated, n..REQ_N_MAX, the n with the
                            * highest log probability per token returned (chat: n) */
    bool stream;
    bool include_usage;    /* stream_options.include_usage */
    bool continuous_usage; /* stream_options.continuous_usage_stats (vLLM's): the usage so far
                            * on every chunk */
    int64_t max_tokens;    /* tokens, >= 1 (>= 0 with echo); -1 when the client gave none */
    int64_t truncate;      /* truncate_prompt_tokens (vLLM's): each prompt keeps its last this
                            * many tokens; -1: the context's size; 0: none given */
    req_sampling sampling;
    uint32_t *bias_tok;    /* owned: [n_bias] logit_bias token ids (distinct) */
    float *bias;           /* owned: [n_bias] their biases, each in [-100, 100] */
    size_t n_bias;
    uint32_t *allowed;     /* owned: [n_allowed] allowed_token_ids (vLLM's): the only tokens
                            * that may be chosen, or NULL: all */
    size_t n_allowed;
    const json_t *bad_words; /* bad_words (vLLM's; in root): 1..REQ_BAD_WORDS_MAX strings, each
                              * with text after its leading whitespace, or NULL */
    uint32_t stop_ids[REQ_STOP_IDS_MAX]; /* stop_token_ids: tokens that end the generation
                                          * (kept in the output, as the end-of-generation
                                          * tokens are) */
    size_t n_stop_ids;
    const char *stop[REQ_STOP_MAX]; /* stop strings (in root), each 1..REQ_STOP_LEN_MAX bytes */
    size_t stop_len[REQ_STOP_MAX];  /* bytes of each */
    size_t n_stop;
    bool logprobs;         /* return the chosen tokens' log probabilities */
    uint32_t top_logprobs; /* alternatives per token, 0..REQ_TOP_LOGPROBS_MAX */
    bool prompt_lp;        /* prompt_logprobs (vLLM's): each prompt token's log probability and
                            * rank, with prompt_top alternatives (not with stream) */
    uint32_t prompt_top;   /* 0..REQ_TOP_LOGPROBS_MAX */
    bool ignore_eos;       /* keep generating past end-of-generation tokens */
    bool keep_special;     /* skip_special_tokens false (vLLM's): control tokens' text is
                              part of the output */
    bool keep_stop;        /* include_stop_str_in_output (vLLM's): the stop string that ended
                            * the text stays at its end */
    msg_format format;     /* response_format: text, json_object, json_schema, a grammar, a
                            * regular expression, a choice; tool_call for a required tool call */
    char *schema;          /* owned: [n_schema] json_schema.schema as compact JSON text (a
                            * schema jsonc compiles), the choice spec, the grammar or the
                            * regular expression, or NULL */
    size_t n_schema;       /* bytes */
    char *prediction;      /* owned: [prediction_len] prediction.content (its text parts
                            * joined), NUL-terminated, or NULL */
    size_t prediction_len; /* bytes */
} gw_request;

/* The field that holds a request's prompt, as errors name it: "input" (responses), "messages"
 * or "prompt"; and its token budget: "max_output_tokens" or "max_tokens". */
static inline const char *req_prompt_param(const gw_request *r)
{
    return r->responses ? "input" : r->kind == REQ_CHAT ? "messages" : "prompt";
}

static inline const char *req_budget_param(const gw_request *r)
{
    return r->responses ? "max_output_tokens" : "max_tokens";
}

/* Parses a chat or completion body of len bytes. On failure *e says why (400) and r holds
 * nothing to free; on success free r with req_free. */
td_err req_parse(gw_request *r, req_kind kind, const char *body, size_t len, api_error *e);
void req_free(gw_request *r);

/* Parses a /v1/responses body (OpenAI's Responses API: `input` items, `instructions`, flat
 * function tools, `text.format`, `max_output_tokens`, `previous_response_id` looked up in
 * store, ...) into the chat request it stands for (kind REQ_CHAT, responses set); errors name
 * the Responses fields (an unknown previous response is 404). store may be NULL: none kept.
 * `conversation`, `prompt` and `background` are refused. */
struct rstore;
td_err req_parse_responses(gw_request *r, const char *body, size_t len, struct rstore *store,
                           api_error *e);

/* Appends Responses items (input or output: messages, function_call, function_call_output,
 * reasoning) to msgs as chat messages. */
td_err req_responses_items(json_t *msgs, const json_t *items, api_error *e);

/* A query parameter, decoded; value NULL for a key alone ("?key"). */
typedef struct req_arg {
    const char *key;
    const char *value;
} req_arg;

#define REQ_LIST_LIMIT_MAX 100 /* items per page of a list (OpenAI's) */

/* A page of items (objects with an "id", in their own order) as OpenAI's list endpoints give
 * it, chosen by the query's parameters (the last of a repeated one counts; unknown ones are
 * ignored): limit (1..REQ_LIST_LIMIT_MAX, default 20), order (asc: as given, desc: the last
 * first; default desc), after and before (an item's id: the page starts after it, or ends
 * right before it), include / include[] (OpenAI's names; none changes a text item). *out is
 * {"object": "list", "data": [...], "first_id", "last_id" (null when empty), "has_more"}; an
 * unknown id or a bad value is 400 naming the parameter. */
td_err req_list_page(const json_t *items, const req_arg *args, size_t n_args, json_t **out,
                     api_error *e);

/* GET /v1/responses/<id>'s query: stream ("true" or "false", default false) and
 * starting_after (a sequence number >= 0; -1 when absent). Others are ignored. */
td_err req_response_query(const req_arg *args, size_t n_args, bool *stream, int64_t *after,
                          api_error *e);

/* /tokenize: {"content"|"prompt": string, "add_special": bool (default true)}. text points
 * into *root, which the caller releases with json_decref. */
td_err req_parse_tokenize(const char *body, size_t len, json_t **root, const char **text,
                          size_t *text_len, bool *add_special, api_error *e);

/* /detokenize: {"tokens": [ids]} -> malloc'd ids, each in [0, n_vocab). */
td_err req_parse_detokenize(const char *body, size_t len, uint32_t n_vocab, int32_t **ids,
                            size_t *n_ids, api_error *e);

/* Bytes of ASCII whitespace (space, tab, newline, return) at the start of s [n]. */
size_t req_leading_space(const char *s, size_t n);

/* Loads a body as a JSON object; 400 with jansson's message (line, column) otherwise. */
td_err req_load_json(const char *body, size_t len, json_t **root, api_error *e);

/* "a string", "an integer", "a number", "a boolean", "an array", "an object", "null": the
 * words of the "expected X, but got Y instead" messages. */
const char *req_type_name(const json_t *v);

#endif
