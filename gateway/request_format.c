/* Structured output fields of a request (request.h): response_format, vLLM's guided_json /
 * guided_choice / guided_regex / guided_grammar / structured_outputs and llama.cpp's
 * json_schema / grammar; each checked by compiling what verifyd will enforce. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/callm.h"
#include "common/gram.h"
#include "common/jsonc.h"
#include "gateway/request_int.h"

/* The format's text (owned, freed on an error) once compiling it gave c: r's format, or the
 * request's error (400 naming param; 500 out of memory). */
static td_err req_format_set(gw_request *r, msg_format format, char *text, td_err c,
                             const char *param, api_error *e)
{
    if (c != TD_OK) {
        free(text);
        if (c == TD_ENOMEM)
            return apierr_set(e, 500, NULL, NULL, "%s", err_msg());
        return apierr_set(e, 400, c == TD_ENOTSUP ? "unsupported_value" : "invalid_value", param,
                          "Invalid value for '%s': %s", param, err_msg());
    }
    r->format = format;
    r->schema = text;
    r->n_schema = strlen(text);
    return TD_OK;
}

/* A JSON Schema (schema, named param in errors; NULL: any JSON value) as the format, compiled
 * here so that what the matcher cannot enforce is this request's 400. */
static td_err req_json_schema(gw_request *r, const json_t *schema, const char *param,
                              api_error *e)
{
    if (schema && !json_is_object(schema) && !json_is_boolean(schema))
        return apierr_set(e, 400, "invalid_type", param,
                          "Invalid type for '%s': expected an object.", param);
    char *text = schema ? json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("true");
    if (!text)
        return apierr_set(e, 500, NULL, NULL, "out of memory for the response format's schema");
    const size_t n = strlen(text);
    if (n > MSG_SCHEMA_MAX) {
        free(text);
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': %zu bytes as compact JSON, at most %u are "
                          "supported.",
                          param, n, MSG_SCHEMA_MAX);
    }
    jc_schema *compiled = NULL;
    const td_err c = jc_compile(text, n, &compiled);
    jc_schema_free(compiled);
    return req_format_set(r, MSG_FORMAT_JSON_SCHEMA, text, c, param, e);
}

/* One structure of structural tags as the tags spec has it ({"begin", "schema", "end"}; the
 * newer form's {"begin", "content": {"type": "json_schema", "json_schema"}, "end"}), or NULL
 * (*e says why). */
static json_t *req_tag(const json_t *st, bool newer, const char *param, api_error *e)
{
    if (!json_is_object(st)) {
        req_bad_type(e, param, "an object", st);
        return NULL;
    }
    const json_t *schema = json_object_get(st, "schema");
    if (newer) {
        const json_t *c = json_object_get(st, "content");
        const json_t *type = json_object_get(c, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "json_schema") != 0) {
            apierr_set(e, 400, "unsupported_value", param,
                       "Unsupported value for '%s': only a tag whose content is "
                       "{\"type\": \"json_schema\", \"json_schema\": ...} is taken.", param);
            return NULL;
        }
        schema = json_object_get(c, "json_schema");
    }
    json_t *one = json_object();
    const json_t *vals[3] = {json_object_get(st, "begin"), schema, json_object_get(st, "end")};
    static const char *const keys[] = {"begin", "schema", "end"};
    for (int k = 0; one && k < 3; k++)
        if (vals[k] && json_object_set(one, keys[k], (json_t *)vals[k]) != 0) {
            json_decref(one);
            one = NULL;
        }
    if (!one)
        apierr_set(e, 500, NULL, NULL, "out of memory");
    return one;
}

/* vLLM's structural tags (o; named param in errors), as the format: free text whose triggers
 * open schema-matched structures (common/callm.h), compiled here so that what the matcher
 * refuses is this request's 400. Taken as {"structures": [{"begin", "schema", "end"}, ...],
 * "triggers": [...]}, or xgrammar's newer {"format": {"type": "triggered_tags", "triggers",
 * "tags": [{"begin", "content": {"type": "json_schema", "json_schema"}, "end"}, ...],
 * "at_least_one", "stop_after_first"}}. */
static td_err req_tags(gw_request *r, const json_t *o, const char *param, api_error *e)
{
    if (!json_is_object(o))
        return req_bad_type(e, param, "an object", o);
    const json_t *fmt = json_object_get(o, "format");
    const bool newer = fmt && !json_object_get(o, "structures");
    char sp[APIERR_PARAM_MAX];
    if (newer) {
        const json_t *type = json_object_get(fmt, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "triggered_tags") != 0)
            return apierr_set(e, 400, "unsupported_value", param,
                              "Unsupported value for '%s': of the \"format\" form only "
                              "\"triggered_tags\" is taken.", param);
        o = fmt;
    }
    const json_t *structures = json_object_get(o, newer ? "tags" : "structures");
    snprintf(sp, sizeof sp, "%.40s%s", param, newer ? ".format.tags" : ".structures");
    if (!json_is_array(structures))
        return req_bad_type(e, sp, "an array", structures ? structures : json_null());
    json_t *list = json_array();
    if (!list)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    size_t i;
    const json_t *st;
    json_array_foreach(structures, i, st) {
        char p[APIERR_PARAM_MAX];
        snprintf(p, sizeof p, "%.60s[%zu]", sp, i);
        json_t *one = req_tag(st, newer, p, e); /* NULL: e says why */
        if (!one || json_array_append_new(list, one) != 0) {
            json_decref(list);
            return one ? apierr_set(e, 500, NULL, NULL, "out of memory") : TD_EINVAL;
        }
    }
    const json_t *triggers = json_object_get(o, "triggers");
    json_t *spec = json_pack("{s:s,s:O,s:o}", "form", "tags", "triggers",
                             triggers ? triggers : json_null(), "structures", list);
    static const char *const flags[] = {"at_least_one", "stop_after_first"};
    for (int k = 0; spec && newer && k < 2; k++) { /* the newer form's; false leaves them out */
        const json_t *f = json_object_get(o, flags[k]);
        if (f && !json_is_false(f) && json_object_set(spec, flags[k], (json_t *)f) != 0) {
            json_decref(spec);
            spec = NULL;
        }
    }
    char *text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (!text)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    cm_grammar *g = NULL;
    const td_err c = strlen(text) > MSG_SCHEMA_MAX
                         ? err_set(TD_ENOTSUP, "%zu bytes as JSON, at most %u are supported",
                                   strlen(text), MSG_SCHEMA_MAX)
                         : cm_compile(text, strlen(text), &g);
    cm_free(g);
    return req_format_set(r, MSG_FORMAT_TAGS, text, c, param, e);
}

/* response_format: {"type": "text"}, {"type": "json_object"} (one JSON object), or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} (one
 * JSON value valid under the schema; without "schema", any JSON value). The schema is compiled
 * here so that what the matcher cannot enforce is this request's 400, not a failed
 * generation. */
td_err req_response_format(gw_request *r, api_error *e)
{
    r->format = MSG_FORMAT_TEXT;
    const json_t *rf = req_field(r->root, "response_format");
    if (!rf)
        return TD_OK;
    if (!json_is_object(rf))
        return req_bad_type(e, "response_format", "an object", rf);
    const json_t *type = json_object_get(rf, "type");
    if (!json_is_string(type))
        return apierr_set(e, 400, "invalid_value", "response_format.type",
                          "Invalid value for 'response_format.type': expected a string.");
    const char *t = json_string_value(type);
    if (strcmp(t, "text") == 0)
        return TD_OK;
    if (strcmp(t, "json_object") == 0) {
        r->format = MSG_FORMAT_JSON_OBJECT;
        return TD_OK;
    }
    if (strcmp(t, "structural_tag") == 0)
        return req_tags(r, rf, "response_format", e);
    if (strcmp(t, "json_schema") != 0)
        return apierr_set(e, 400, "unsupported_value", "response_format.type",
                          "Unsupported value for 'response_format.type': '%s'; supported are "
                          "'text', 'json_object', 'json_schema' and 'structural_tag'.", t);
    const json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return apierr_set(e, 400, "invalid_value", "response_format.json_schema",
                          "Invalid value for 'response_format.json_schema': expected an object.");
    const json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    if (name && !json_is_string(name))
        return apierr_set(e, 400, "invalid_type", "response_format.json_schema.name",
                          "Invalid type for 'response_format.json_schema.name': expected a "
                          "string.");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return apierr_set(e, 400, "invalid_type", "response_format.json_schema.strict",
                          "Invalid type for 'response_format.json_schema.strict': expected a "
                          "boolean.");
    return req_json_schema(r, json_object_get(js, "schema"), "response_format.json_schema.schema",
                           e);
}

/* A grammar (GBNF or Lark) or a regular expression as the format, compiled here so that what the
 * matcher refuses is this request's 400. */
static td_err req_grammar(gw_request *r, const json_t *v, bool regex, const char *param,
                          api_error *e)
{
    if (!json_is_string(v))
        return req_bad_type(e, param, "a string", v);
    const size_t n = json_string_length(v);
    if (n == 0)
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': it is empty.", param);
    if (n > MSG_SCHEMA_MAX)
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': %zu bytes, at most %u are supported.", param,
                          n, MSG_SCHEMA_MAX);
    char *text = malloc(n + 1);
    if (!text)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    memcpy(text, json_string_value(v), n + 1);
    if (memchr(text, 0, n)) {
        free(text);
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': it holds a NUL character.", param);
    }
    gm_grammar *g = NULL;
    const td_err c = regex ? gm_compile_regex(text, n, &g) : gm_compile_grammar(text, n, &g);
    gm_free(g);
    return req_format_set(r, regex ? MSG_FORMAT_REGEX : MSG_FORMAT_GRAMMAR, text, c, param, e);
}

/* Every object schema in schema (type "object") without additionalProperties gets false. */
static td_err req_close_objects(json_t *schema)
{
    if (json_is_array(schema)) {
        size_t i;
        json_t *x;
        json_array_foreach(schema, i, x)
            TD_TRY(req_close_objects(x));
        return TD_OK;
    }
    if (!json_is_object(schema))
        return TD_OK;
    const char *k;
    json_t *x;
    json_object_foreach(schema, k, x)
        TD_TRY(req_close_objects(x));
    const json_t *type = json_object_get(schema, "type");
    if (json_is_string(type) && strcmp(json_string_value(type), "object") == 0 &&
        !json_object_get(schema, "additionalProperties") &&
        json_object_set_new(schema, "additionalProperties", json_false()) != 0)
        return TD_ENOMEM;
    return TD_OK;
}

/* vLLM's structured_outputs so: the one of json / choice / regex / grammar given (*v, *kind,
 * *param), or json_object true (r's format, *kind NULL); a null member is absent. Beside it:
 * disable_fallback (one engine: nothing to fall back to), disable_additional_properties (*closed:
 * object schemas without additionalProperties are closed), disable_any_whitespace (*compact:
 * JSON without whitespace; other kinds as they are) and whitespace_pattern at its default
 * only (null). */
static td_err req_structured_outputs(gw_request *r, const json_t **v, const char **kind,
                                     const char **param, bool *closed, bool *compact,
                                     api_error *e)
{
    static const char *const kinds[] = {"json", "choice", "regex", "grammar", "json_object",
                                        "structural_tag"};
    static const char *const params[] = {"structured_outputs.json",
                                         "structured_outputs.choice",
                                         "structured_outputs.regex",
                                         "structured_outputs.grammar",
                                         "structured_outputs.json_object",
                                         "structured_outputs.structural_tag"};
    static const char *const flags[] = {"disable_fallback", "disable_additional_properties",
                                        "disable_any_whitespace"};
    const json_t *so = *v;
    if (!json_is_object(so))
        return req_bad_type(e, "structured_outputs", "an object", so);
    int found = 0;
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)so, k, x) {
        size_t i = 0, f = 0;
        while (i < 6 && strcmp(k, kinds[i]) != 0)
            i++;
        while (f < 3 && strcmp(k, flags[f]) != 0)
            f++;
        char name[64];
        snprintf(name, sizeof name, "structured_outputs.%s", k);
        if (json_is_null(x))
            continue;
        if (f < 3 || i == 4) {
            if (!json_is_boolean(x))
                return req_bad_type(e, i == 4 ? params[4] : name, "a boolean", x);
            if (f == 1)
                *closed = json_is_true(x);
            if (f == 2)
                *compact = json_is_true(x);
            if (f < 3 || json_is_false(x))
                continue;
        } else if (strcmp(k, "whitespace_pattern") == 0) {
            return apierr_set(e, 400, "unsupported_value", name,
                              "Unsupported value for '%s': JSON is matched with the whitespace "
                              "JSON allows, or none with disable_any_whitespace (give null).",
                              name);
        } else if (i == 6) {
            return apierr_set(e, 400, "unsupported_value", "structured_outputs",
                              "Unsupported value for 'structured_outputs': '%s'; supported "
                              "are 'json', 'choice', 'regex', 'grammar', 'json_object' and "
                              "'structural_tag'.", k);
        }
        if (found++ == 0) {
            *v = x;
            *kind = i == 4 ? NULL : kinds[i];
            *param = params[i];
        }
    }
    if (found != 1)
        return apierr_set(e, 400, "invalid_value", "structured_outputs",
                          "Invalid value for 'structured_outputs': give one of 'json', "
                          "'choice', 'regex', 'grammar', 'json_object' and "
                          "'structural_tag'.");
    if (!*kind)
        r->format = *compact ? MSG_FORMAT_JSON_OBJECT_COMPACT : MSG_FORMAT_JSON_OBJECT;
    return TD_OK;
}

/* Guided decoding beside response_format, one way of asking at most: vLLM's guided_json (a
 * schema, or its JSON text), guided_choice (strings), guided_regex, guided_grammar (GBNF or
 * Lark), or structured_outputs with one of json / choice / regex / grammar / json_object;
 * llama.cpp's json_schema and grammar. */
td_err req_guided(gw_request *r, api_error *e)
{
    static const struct {
        const char *field, *kind;
    } fields[] = {{"guided_json", "json"},   {"guided_choice", "choice"},
                  {"guided_regex", "regex"}, {"guided_grammar", "grammar"},
                  {"json_schema", "json"},   {"grammar", "grammar"},
                  {"structured_outputs", NULL}};
    const json_t *v = NULL;
    const char *param = NULL, *kind = NULL;
    int asked = 0;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const json_t *f = req_field(r->root, fields[i].field);
        if (f && asked++ == 0) {
            v = f;
            param = fields[i].field;
            kind = fields[i].kind;
        }
    }
    const json_t *ws = req_field(r->root, "guided_whitespace_pattern"); /* vLLM before 0.12 */
    if (ws && !json_is_null(ws))
        return apierr_set(e, 400, "unsupported_value", "guided_whitespace_pattern",
                          "Unsupported value for 'guided_whitespace_pattern': JSON is matched "
                          "with the whitespace JSON allows, or none with structured_outputs' "
                          "disable_any_whitespace (give null).");
    if (asked == 0)
        return TD_OK;
    if (asked > 1 || r->format != MSG_FORMAT_TEXT)
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': ask for one structured output only "
                          "(response_format, guided_json, guided_choice, guided_regex, "
                          "guided_grammar, structured_outputs, json_schema, grammar).",
                          param);
    bool closed = false, compact = false; /* structured_outputs' options */
    if (!kind) /* structured_outputs */
        TD_TRY(req_structured_outputs(r, &v, &kind, &param, &closed, &compact, e));
    if (!kind) /* json_object */
        return TD_OK;
    if (strcmp(kind, "regex") == 0 || strcmp(kind, "grammar") == 0)
        return req_grammar(r, v, kind[0] == 'r', param, e);
    if (strcmp(kind, "structural_tag") == 0) { /* its JSON text (vLLM's), or the object */
        json_t *o = json_is_string(v) ? json_loads(json_string_value(v), 0, NULL)
                                      : json_incref((json_t *)v);
        if (!o)
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': the text is not JSON.", param);
        const td_err err = req_tags(r, o, param, e);
        json_decref(o);
        return err;
    }
    if (strcmp(kind, "json") == 0) { /* a schema, or its JSON text */
        json_t *schema = json_is_string(v) ? json_loads(json_string_value(v), 0, NULL)
                                           : json_deep_copy(v);
        if (!schema && json_is_string(v))
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': the text is not JSON.", param);
        if (!schema)
            return apierr_set(e, 500, NULL, NULL, "out of memory");
        td_err err = closed ? req_close_objects(schema) : TD_OK;
        err = err == TD_OK ? req_json_schema(r, schema, param, e)
                           : apierr_set(e, 500, NULL, NULL, "out of memory");
        json_decref(schema);
        if (err == TD_OK && compact)
            r->format = MSG_FORMAT_JSON_SCHEMA_COMPACT;
        return err;
    }
    if (!json_is_array(v))
        return req_bad_type(e, param, "an array of strings", v);
    json_t *spec = json_pack("{s:s,s:O}", "form", "choice", "choices", v);
    char *text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (!text)
        return apierr_set(e, 500, NULL, NULL, "out of memory");
    cm_grammar *g = NULL;
    td_err c = strlen(text) > MSG_SCHEMA_MAX
                   ? err_set(TD_ENOTSUP, "%zu bytes as JSON, at most %u are supported",
                             strlen(text), MSG_SCHEMA_MAX)
                   : cm_compile(text, strlen(text), &g);
    cm_free(g);
    return req_format_set(r, MSG_FORMAT_CHOICE, text, c, param, e);
}
