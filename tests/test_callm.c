/* The tool-call matcher (common/callm.h): texts of the XML and JSON forms cut at the exact byte
 * the functions' schemas refuse (names, required and repeated parameters, enum strings,
 * integer ranges, whitespace around JSON values, "</parameter>" inside values), whole calls
 * recognised, compile errors with their messages, and random walks that never reach a state
 * no byte continues. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/callm.h"

static const char XML[] =
    "{\"form\":\"xml\",\"tools\":["
    "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"enum\":[\"Paris\",\"Rome\"]},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14},"
    "\"note\":{\"type\":[\"string\",\"null\"],\"description\":\"free text\"},"
    "\"units\":{\"description\":\"anything\"},"
    "\"flags\":{\"type\":\"object\",\"properties\":{\"metric\":{\"$ref\":\"#/$defs/b\"}},"
    "\"additionalProperties\":false}},"
    "\"required\":[\"city\"],\"$defs\":{\"b\":{\"type\":\"boolean\"}}}},"
    "{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":{}}},"
    "{\"name\":\"echo\"}]}";

static const char JSONF[] =
    "{\"form\":\"json\",\"tools\":["
    "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"enum\":[\"Paris\",\"Rome\"]}},\"required\":[\"city\"]}},"
    "{\"name\":\"get_time\"}]}";

static cm_grammar *compile(const char *spec)
{
    cm_grammar *g = NULL;
    if (cm_compile(spec, strlen(spec), &g) != TD_OK)
        fail_msg("compile: %s", err_msg());
    return g;
}

/* How many bytes of text the matcher takes from the start (strlen when all), and whether the
 * whole text is a whole call. */
static size_t taken(const cm_grammar *g, const char *text, bool *done)
{
    uint8_t *st = malloc(cm_state_size(g));
    assert_non_null(st);
    cm_state_init(g, st);
    size_t n = strlen(text), i = 0;
    while (i < n && cm_feed(g, st, (const uint8_t *)text + i, 1))
        i++;
    if (done)
        *done = i == n && cm_done(g, st);
    free(st);
    return i;
}

static void whole(const cm_grammar *g, const char *text)
{
    bool done = false;
    size_t n = taken(g, text, &done);
    if (n != strlen(text) || !done)
        fail_msg("'%s': %zu of %zu bytes taken, done %d", text, n, strlen(text), done);
}

/* The text is refused exactly at its last byte. */
static void refused_at_end(const cm_grammar *g, const char *text)
{
    size_t n = taken(g, text, NULL);
    if (n != strlen(text) - 1)
        fail_msg("'%s': %zu bytes taken, want %zu", text, n, strlen(text) - 1);
}

#define W "\n<function=get_weather>\n"

static void xml_calls_are_recognised(void **s)
{
    (void)s;
    cm_grammar *g = compile(XML);
    whole(g, W "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
             "</function>\n");
    whole(g, "<function=get_weather><parameter=days>14</parameter><parameter=city>Rome"
             "</parameter></function>");
    whole(g, W "<parameter=city>\nRome\n</parameter>\n<parameter=note>\nsay \"hi\" \\ to\n"
             "them </parameters are </parameter\n\n</parameter>\n<parameter=units>\n<b>any "
             "thing</b>\n</parameter>\n<parameter=flags>\n{\"metric\": true}\n</parameter>\n"
             "</function>");
    whole(g, "<function=get_time>\n</function>");
    whole(g, "<function=echo>\n<parameter=x y>\nhello <world>\n</parameter>\n<parameter=x y>"
             "\n</parameter>\n</function>\n\n");
    bool done = true;
    assert_int_equal(taken(g, W "<parameter=city>\nParis\n</parameter>\n", &done),
                     strlen(W "<parameter=city>\nParis\n</parameter>\n"));
    assert_false(done);
    cm_free(g);
}

static void xml_refuses_what_the_schemas_refuse(void **s)
{
    (void)s;
    cm_grammar *g = compile(XML);
    /* names */
    refused_at_end(g, "\n<function=get_x");
    refused_at_end(g, "<function=get_time2");
    refused_at_end(g, "<function=get_time>\n<p");    /* no parameters declared */
    refused_at_end(g, W "<parameter=cityx");
    refused_at_end(g, W "<parameter=z");
    refused_at_end(g, " <F");
    /* required and repeated */
    refused_at_end(g, W "</");
    refused_at_end(g, W "<parameter=days>\n2\n</parameter>\n</");
    refused_at_end(g, W "<parameter=city>\nRome\n</parameter>\n<parameter=c");
    /* enum strings: a byte no member goes on with, an end before a member is whole, and a
     * '<' or newline that could neither end the value nor be its text */
    refused_at_end(g, W "<parameter=city>\nB");
    refused_at_end(g, W "<parameter=city>\nParis!");
    refused_at_end(g, W "<parameter=city>\nParis\n</parameterX");
    refused_at_end(g, W "<parameter=city>\nPar<");
    refused_at_end(g, W "<parameter=city>\nPar\n");
    /* integers: range, and no whitespace around the JSON text */
    refused_at_end(g, W "<parameter=days>\n0");
    refused_at_end(g, W "<parameter=days>\n15");
    refused_at_end(g, W "<parameter=days>\n ");
    refused_at_end(g, W "<parameter=days>\n3 ");
    refused_at_end(g, W "<parameter=days>\n3\n\n");
    refused_at_end(g, W "<parameter=days>\n<"); /* empty, or not JSON */
    refused_at_end(g, W "<parameter=flags>\n{\"metric\": 1");
    /* whitespace between tags, and after the call */
    refused_at_end(g, "\n<function=get_time>\n\n\n\n\n\n\n\n\n");
    refused_at_end(g, "<function=get_time></function> x");
    cm_free(g);
}

static void state_copies_go_on_alike(void **s)
{
    (void)s;
    cm_grammar *g = compile(XML);
    const size_t sz = cm_state_size(g);
    uint8_t *a = malloc(sz), *b = malloc(sz);
    const char *head = W "<parameter=city>\nRome</parameter><parameter=note>\nab</para",
               *tail = "meter>\n</function>";
    cm_state_init(g, a);
    assert_true(cm_feed(g, a, (const uint8_t *)head, strlen(head)));
    memset(b, 0xA5, sz);
    cm_state_copy(g, b, a);
    assert_true(cm_feed(g, b, (const uint8_t *)tail, strlen(tail)));
    assert_true(cm_done(g, b));
    assert_false(cm_feed(g, a, (const uint8_t *)"meter>\n</functiom", 17));
    free(a);
    free(b);
    cm_free(g);
}

static void json_form_is_one_object_per_function(void **s)
{
    (void)s;
    cm_grammar *g = compile(JSONF);
    whole(g, "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n");
    whole(g, "{\"arguments\": {}, \"name\": \"get_time\"}");
    refused_at_end(g, "{\"name\": \"n");
    refused_at_end(g, "{\"name\": \"get_weather\", \"arguments\": {}");
    refused_at_end(g, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"O");
    refused_at_end(g, "{\"name\": \"get_time\", \"arguments\": {},");
    cm_free(g);
}

/* A choice: exactly one of the strings (any bytes), a prefix of a longer one done already,
 * repeats one. */
static void a_choice_is_one_of_its_strings(void **s)
{
    (void)s;
    cm_grammar *g = compile("{\"form\":\"choice\",\"choices\":[\"yes\",\"no\",\"yes!\",\"<a>\\n\","
                            "\"no\"]}");
    whole(g, "yes");
    whole(g, "yes!");
    whole(g, "no");
    whole(g, "<a>\n");
    refused_at_end(g, "yes!!");
    refused_at_end(g, "nop");
    refused_at_end(g, "Y");
    bool done = true;
    assert_int_equal(taken(g, "ye", &done), 2);
    assert_false(done);
    cm_free(g);
    const char *bad[] = {"{\"form\":\"choice\",\"choices\":[]}",
                         "{\"form\":\"choice\",\"choices\":[\"a\",\"\"]}",
                         "{\"form\":\"choice\",\"choices\":[\"a\",1]}"};
    for (size_t i = 0; i < 3; i++) {
        cm_grammar *x = NULL;
        assert_int_equal(cm_compile(bad[i], strlen(bad[i]), &x), TD_EINVAL);
        assert_non_null(strstr(err_msg(), "choice"));
        assert_null(x);
    }
}

static const char TAGS[] =
    "{\"form\":\"tags\",\"triggers\":[\"<function=\"],\"structures\":["
    "{\"begin\":\"<function=get_weather>\",\"schema\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"enum\":[\"Paris\",\"Rome\"]}},\"required\":[\"city\"],"
    "\"additionalProperties\":false},\"end\":\"</function>\"},"
    "{\"begin\":\"<function=get_time>\",\"schema\":{\"type\":\"integer\"},\"end\":\"\\n\"}]}";

/* Structural tags: free text (a partial trigger too) until a trigger, then a begin, JSON
 * under that structure's schema, its end, and free text again. */
static void structural_tags_match_what_the_triggers_open(void **s)
{
    (void)s;
    cm_grammar *g = compile(TAGS);
    whole(g, "");
    whole(g, "any text at all, <functio and < and \"quotes\" \\");
    whole(g, "I'll look: <function=get_weather>{\"city\": \"Paris\"}</function> done.");
    whole(g, "<function=get_time>12\nand <function=get_weather>{\"city\":\"Rome\"}</function>");
    whole(g, "x<function=get_weather> {\"city\": \"Rome\"} </function>"); /* JSON's spaces */
    refused_at_end(g, "<function=get_x");
    refused_at_end(g, "<function=get_weather>{\"city\": \"O");
    refused_at_end(g, "<function=get_weather>{\"city\": \"Paris\",");
    refused_at_end(g, "<function=get_weather>{\"city\": \"Paris\"}</func>");
    refused_at_end(g, "<function=get_time>1.");
    bool done = true;
    assert_int_equal(taken(g, "<function=get_w", &done), 15); /* a begin on its way */
    assert_false(done);
    assert_int_equal(taken(g, "<function=get_time>12", &done), 21); /* inside: not done */
    assert_false(done);
    assert_int_equal(taken(g, "a <funct", &done), 8); /* a partial trigger is free text */
    assert_true(done);
    /* free text without a trigger's first byte leaves the state as it was; so does a whole
     * structure (what a copy keeps is the start's) */
    const size_t sz = cm_state_size(g);
    uint8_t *st = malloc(sz), *a = calloc(1, sz), *b = calloc(1, sz);
    cm_state_init(g, st);
    cm_state_copy(g, a, st);
    assert_true(cm_feed(g, st, (const uint8_t *)"<function=get_time>12\n", 22));
    cm_state_copy(g, b, st);
    assert_memory_equal(a, b, sz);
    free(a);
    free(b);
    assert_true(cm_free_text(g, st));
    assert_true(cm_feed(g, st, (const uint8_t *)"<", 1));
    assert_false(cm_free_text(g, st));
    free(st);
    cm_free(g);
    /* at_least_one: whole only after a structure; stop_after_first: nothing after the first */
    g = compile("{\"form\":\"tags\",\"triggers\":[\"<\"],\"structures\":[{\"begin\":\"<n>\","
                "\"schema\":{\"type\":\"integer\"},\"end\":\"</n>\"}],\"at_least_one\":true,"
                "\"stop_after_first\":true}");
    assert_int_equal(taken(g, "text", &done), 4);
    assert_false(done);
    whole(g, "text <n>42</n>");
    refused_at_end(g, "text <n>42</n>.");
    refused_at_end(g, "<n>42</n><");
    cm_free(g);
    static const struct {
        const char *spec;
        td_err code;
        const char *says;
    } bad[] = {
        {"{\"form\":\"tags\",\"triggers\":[\"<a\"],\"structures\":[{\"begin\":\"<a>\","
         "\"schema\":{},\"end\":\"x\"}],\"stop_after_first\":1}", TD_EINVAL,
         "stop_after_first must be a boolean"},
        {"{\"form\":\"tags\",\"triggers\":[],\"structures\":[{\"begin\":\"<a>\",\"schema\":{},"
         "\"end\":\"<\"}]}", TD_EINVAL, "triggers must be"},
        {"{\"form\":\"tags\",\"triggers\":[\"<a\",\"x<a>\"],\"structures\":[{\"begin\":\"<a>\","
         "\"schema\":{},\"end\":\"<\"}]}", TD_ENOTSUP, "holds or is held"},
        {"{\"form\":\"tags\",\"triggers\":[\"<a\"],\"structures\":[{\"begin\":\"<b>\","
         "\"schema\":{},\"end\":\"<\"}]}", TD_EINVAL, "does not begin with a trigger"},
        {"{\"form\":\"tags\",\"triggers\":[\"<a\",\"<b\"],\"structures\":[{\"begin\":\"<a>\","
         "\"schema\":{},\"end\":\"<\"}]}", TD_EINVAL, "trigger '<b' begins no structure"},
        {"{\"form\":\"tags\",\"triggers\":[\"<a\"],\"structures\":[{\"begin\":\"<a>\","
         "\"schema\":{},\"end\":\"\"}]}", TD_EINVAL, "structures[0].end"},
        {"{\"form\":\"tags\",\"triggers\":[\"<a\"],\"structures\":[{\"begin\":\"<a\","
         "\"schema\":{},\"end\":\"x\"},{\"begin\":\"<a>\",\"schema\":{},\"end\":\"x\"}]}",
         TD_ENOTSUP, "is the beginning of"},
        {"{\"form\":\"tags\",\"triggers\":[\"<a\"],\"structures\":[{\"begin\":\"<a>\","
         "\"schema\":3,\"end\":\"x\"}]}", TD_EINVAL, "structures[0].schema"},
        {"{\"form\":\"tags\",\"triggers\":[\"<a\"],\"structures\":[{\"begin\":\"<a>\","
         "\"schema\":{\"type\":\"integer\",\"multipleOf\":2},\"end\":\"x\"}]}", TD_ENOTSUP,
         "structures[0].schema: "},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cm_grammar *x = NULL;
        td_err e = cm_compile(bad[i].spec, strlen(bad[i].spec), &x);
        if (e != bad[i].code || !strstr(err_msg(), bad[i].says))
            fail_msg("%s: %s (%d), want %s", bad[i].spec, err_msg(), (int)e, bad[i].says);
        assert_null(x);
    }
}

static void compile_errors_say_why(void **s)
{
    (void)s;
    static const struct {
        const char *spec;
        td_err code;
        const char *says;
    } bad[] = {
        {"{\"form\":\"yaml\",\"tools\":[{\"name\":\"f\"}]}", TD_EINVAL, "form"},
        {"{\"form\":\"xml\",\"tools\":[]}", TD_EINVAL, "non-empty"},
        {"{\"form\":\"xml\",\"tools\":[{\"name\":\"f\"},{\"name\":\"f\"}]}", TD_EINVAL,
         "two functions are named 'f'"},
        {"{\"form\":\"xml\",\"tools\":[{\"name\":\"a>b\"}]}", TD_ENOTSUP, "'a>b'"},
        {"{\"form\":\"xml\",\"tools\":[{\"name\":\"f\",\"parameters\":{\"properties\":{\"a\":{}},"
         "\"required\":[\"b\"]}}]}",
         TD_ENOTSUP, "requires a parameter"},
        {"{\"form\":\"xml\",\"tools\":[{\"name\":\"f\",\"parameters\":{\"properties\":{\"a\":"
         "{\"type\":\"integer\",\"multipleOf\":2}}}}]}",
         TD_ENOTSUP, "function 'f' parameter 'a': "},
        {"{\"form\":\"xml\",\"tools\":[{\"name\":\"f\",\"parameters\":{\"properties\":{\"a\":"
         "{\"type\":\"string\",\"enum\":[1]}}}}]}",
         TD_EINVAL, "parameter 'a'"},
        {"{\"form\":\"json\",\"tools\":[{\"name\":\"f\",\"parameters\":{\"$defs\":{\"x\":{}}}},"
         "{\"name\":\"g\",\"parameters\":{\"$defs\":{\"x\":{\"type\":\"string\"}}}}]}",
         TD_ENOTSUP, "define 'x' differently"},
        {"not json", TD_EINVAL, "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cm_grammar *g = NULL;
        td_err e = cm_compile(bad[i].spec, strlen(bad[i].spec), &g);
        if (e != bad[i].code || !strstr(err_msg(), bad[i].says))
            fail_msg("%s: %s (%d), want %s", bad[i].spec, err_msg(), (int)e, bad[i].says);
        assert_null(g);
    }
}

/* From every prefix a random walk reaches, some byte goes on or the call is whole: no state
 * is a dead end. Bytes are drawn from the grammar's own alphabet so walks get deep. */
static void random_walks_never_get_stuck(void **s)
{
    (void)s;
    static const char alpha[] = "<>/=\n \"\\{}:,0123456789.-trufalsn"
                                "functionparameterget_weathercitydaysnoteunitsflagsmetric"
                                "ParisRome";
    const char *specs[] = {XML, JSONF, "{\"form\":\"choice\",\"choices\":[\"Paris\",\"Pa\","
                                       "\"Rome\",\"ParisX\"]}", TAGS};
    for (int k = 0; k < 4; k++) {
        cm_grammar *g = compile(specs[k]);
        const size_t sz = cm_state_size(g);
        uint8_t *st = malloc(sz), *t = malloc(sz);
        uint32_t x = 12345u + (uint32_t)k;
        for (int walk = 0; walk < 400; walk++) {
            cm_state_init(g, st);
            for (int step = 0; step < 400; step++) {
                uint8_t ok[256];
                int n_ok = 0;
                for (int b = 0; b < 256; b++) {
                    cm_state_copy(g, t, st);
                    const uint8_t c = (uint8_t)b;
                    if (cm_feed(g, t, &c, 1))
                        ok[n_ok++] = c;
                }
                if (n_ok == 0) {
                    assert_true(cm_done(g, st));
                    break;
                }
                /* mostly the alphabet's bytes that pass, else any that passes */
                uint8_t pick = ok[0];
                for (int tries = 0; tries < 8; tries++) {
                    x = x * 1103515245u + 12345u;
                    const uint8_t c = (uint8_t)alpha[(x >> 16) % (sizeof alpha - 1)];
                    if (memchr(ok, c, (size_t)n_ok)) {
                        pick = c;
                        break;
                    }
                    pick = ok[(x >> 8) % (uint32_t)n_ok];
                }
                assert_true(cm_feed(g, st, &pick, 1));
            }
        }
        free(st);
        free(t);
        cm_free(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(xml_calls_are_recognised),
        cmocka_unit_test(xml_refuses_what_the_schemas_refuse),
        cmocka_unit_test(state_copies_go_on_alike),
        cmocka_unit_test(json_form_is_one_object_per_function),
        cmocka_unit_test(a_choice_is_one_of_its_strings),
        cmocka_unit_test(structural_tags_match_what_the_triggers_open),
        cmocka_unit_test(compile_errors_say_why),
        cmocka_unit_test(random_walks_never_get_stuck),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
