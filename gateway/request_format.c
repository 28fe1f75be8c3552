/* Structured output fields of a request (request.h): response_format, and vLLM's
 * guided_json / guided_choice / structured_outputs; each checked by compiling what verifyd will
 * enforce. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/callm.h"
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
    if (strcmp(t, "json_schema") != 0)
        return apierr_set(e, 400, "unsupported_value", "response_format.type",
                          "Unsupported value for 'response_format.type': '%s'; supported are "
                          "'text', 'json_object' and 'json_schema'.", t);
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

/* vLLM's guided decoding: guided_json (a schema, or its JSON text), guided_choice (strings),
 * or structured_outputs {"json": ...} / {"choice": [...]}; one way of asking at most. */
td_err req_guided(gw_request *r, api_error *e)
{
    const json_t *gj = req_field(r->root, "guided_json");
    const json_t *gc = req_field(r->root, "guided_choice");
    const json_t *so = req_field(r->root, "structured_outputs");
    const char *param = gj ? "guided_json" : gc ? "guided_choice" : "structured_outputs";
    if (!gj && !gc && !so)
        return TD_OK;
    if ((gj != NULL) + (gc != NULL) + (so != NULL) > 1 || r->format != MSG_FORMAT_TEXT)
        return apierr_set(e, 400, "invalid_value", param,
                          "Invalid value for '%s': ask for one structured output only "
                          "(response_format, guided_json, guided_choice, structured_outputs).",
                          param);
    if (so) {
        if (!json_is_object(so))
            return req_bad_type(e, "structured_outputs", "an object", so);
        gj = json_object_get(so, "json");
        gc = json_object_get(so, "choice");
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)so, k, v) {
            if (strcmp(k, "json") != 0 && strcmp(k, "choice") != 0)
                return apierr_set(e, 400, "unsupported_value", "structured_outputs",
                                  "Unsupported value for 'structured_outputs': '%s'; supported "
                                  "are 'json' and 'choice'.",
                                  k);
        }
        if ((gj != NULL) == (gc != NULL))
            return apierr_set(e, 400, "invalid_value", "structured_outputs",
                              "Invalid value for 'structured_outputs': give one of 'json' and "
                              "'choice'.");
        param = gj ? "structured_outputs.json" : "structured_outputs.choice";
    }
    if (gj && json_is_string(gj)) { /* the schema as JSON text */
        json_t *parsed = json_loads(json_string_value(gj), 0, NULL);
        if (!parsed)
            return apierr_set(e, 400, "invalid_value", param,
                              "Invalid value for '%s': the text is not JSON.", param);
        td_err err = req_json_schema(r, parsed, param, e);
        json_decref(parsed);
        return err;
    }
    if (gj)
        return req_json_schema(r, gj, param, e);
    if (!json_is_array(gc))
        return req_bad_type(e, param, "an array of strings", gc);
    json_t *spec = json_pack("{s:s,s:O}", "form", "choice", "choices", gc);
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
