/* check_json_schema: JSON Schema to grammar (src/schema/kg_json_schema.c).
 * Documents fed byte by byte to the compiled grammar: valid ones (in the
 * form the grammar produces: required properties first, then optional, in
 * schema order) are accepted and complete, invalid ones are refused; and
 * every unsupported keyword is refused with its name and JSON pointer. */
#include "check_common.h"
#include "grammar/kg_grammar.h"
#include "schema/kg_json_schema.h"

#include <stdio.h>
#include <string.h>

static kg_gvocab_t *byte_vocab(void) {
    static char bytes[256];
    const char *texts[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        texts[i] = &bytes[i];
        lens[i] = 1;
    }
    char err[128];
    kg_gvocab_t *v = kg_gvocab_new_raw(texts, lens, 256, err, sizeof(err));
    ck_assert_msg(v != NULL, "%s", err);
    return v;
}

static kg_grammar_t *compile(kg_gvocab_t *v, const char *schema) {
    char err[512] = "";
    kg_gir_t *ir = kg_json_schema_gir(schema, strlen(schema), err, sizeof(err));
    ck_assert_msg(ir != NULL, "%s: %s", schema, err);
    kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s: %s", schema, err);
    kg_gir_free(ir);
    return g;
}

/* Whether the grammar accepts `doc` as a complete document. */
static bool accepts(kg_grammar_t *g, const char *doc) {
    kg_matcher_t *m = kg_matcher_new();
    kg_matcher_reset(m, g);
    bool ok = true;
    for (const unsigned char *p = (const unsigned char *)doc; *p && ok; p++) {
        ok = kg_matcher_accept(m, *p);
    }
    ok = ok && kg_matcher_can_end(m);
    kg_matcher_free(m);
    return ok;
}

static const struct {
    const char *schema;
    const char *good[4];
    const char *bad[4];
} cases[] = {
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-3,\"maximum\":"
     "120},\"b\":{\"type\":\"string\",\"maxLength\":3}},\"required\":[\"a\"]}",
     {"{\"a\":-3}", "{ \"a\" : 120 , \"b\" : \"xy\" }", "{\"a\":7,\"b\":\"\\u00e9\\n\"}",
      "{\n  \"a\": 0\n}"},
     {"{\"a\":121}", "{\"a\":-4}", "{\"b\":\"x\"}", "{\"a\":1,\"b\":\"long\"}"}},
    {"{\"enum\":[\"x\",1,null,{\"k\":[true]}]}",
     {"\"x\"", "1", "null", "{\"k\":[true]}"},
     {"\"y\"", "2", "{\"k\":[false]}", "x"}},
    {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":"
     "{\"$ref\":\"#/$defs/n\"}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}",
     {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":-3}}}", NULL},
     {"{\"next\":{\"v\":1}}", "{\"v\":1,\"next\":{}}", NULL}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"},{\"type\":\"null\"}],\"items\":"
     "{\"type\":\"number\"},\"maxItems\":4}",
     {"[true,null]", "[false,null,1.5e3,-0.25]", NULL},
     {"[null,true]", "[true,null,1,2,3]", "[true,null,\"x\"]", NULL}},
    {"{\"type\":\"string\",\"pattern\":\"^[a-c]{2}\\\\d$\"}",
     {"\"ab3\"", "\"cc0\"", NULL},
     {"\"ab\"", "\"abc3\"", "\"ad3\"", NULL}},
    {"{\"type\":\"string\",\"pattern\":\"q\\\"\"}", /* unanchored: anything around q" */
     {"\"q\\\"\"", "\"xx q\\\" yy\"", NULL},
     {"\"q\"", "\"\\\"\"", NULL}},
    {"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"additionalProperties\":"
     "{\"type\":\"boolean\"}}",
     {"{\"id\":1,\"x\":true}", "{\"other\":false,\"i\":true}", "{}", NULL},
     {"{\"id\":true}", "{\"x\":1}", NULL}},
    {"{\"anyOf\":[{\"type\":\"string\",\"format\":\"date\"},{\"type\":\"string\",\"format\":"
     "\"uuid\"}]}",
     {"\"2024-02-28\"", "\"2023-12-31\"", "\"123e4567-e89b-12d3-a456-426614174000\"", NULL},
     {"\"2024-02-30\"", "\"2024-13-01\"", "\"2024-04-31\"", NULL}},
    {"{\"type\":\"object\"}", {"{}", "{\"any\":[1,{\"x\":null}]}", NULL}, {"[]", "{\"a\"}", NULL}},
    /* minLength with maxLength, reached through "definitions" */
    {"{\"definitions\":{\"code\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}},"
     "\"$ref\":\"#/definitions/code\"}",
     {"\"ab\"", "\"abc\"", "\"a\\n\"", NULL},
     {"\"a\"", "\"\"", "\"abcd\"", NULL}},
    /* whitespace between tokens is bounded: a newline and 20 spaces, not 21 or two newlines */
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}",
     {"{\n                    \"a\": 1}", "{ \"a\" : 1 }", NULL},
     {"{\n                     \"a\": 1}", "{\n\n\"a\": 1}", NULL}},
    {"{\"allOf\":[{\"properties\":{\"a\":{\"const\":1}},\"required\":[\"a\"]},{\"properties\":{"
     "\"b\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}]}",
     {"{\"a\":1,\"b\":false}", NULL},
     {"{\"a\":1}", "{\"b\":true,\"a\":1}", NULL}},
};

/* Length bounds with a format or pattern: strings at the bounds (min-1,
 * min, max, max+1), counted in characters whatever their encoding: an
 * escape (\" \n \u00e9) and a multi-byte character (é, 😀) are one each. */
static const struct {
    const char *schema;
    const char *good[6];
    const char *bad[6];
} combined[] = {
    /* email (6..72 characters alone) with maxLength 12 */
    {"{\"type\":\"string\",\"format\":\"email\",\"maxLength\":12}",
     {"\"a@b.cd\"", "\"abcdef@gh.ij\"", "\"x@y.abcdef\"", NULL},
     {"\"abcdefg@hi.jk\"", "\"a@bcdefghij.kl\"", "\"@b.cd\"", "\"a@b.c\"", NULL}},
    /* email with minLength 8 and maxLength 9 */
    {"{\"type\":\"string\",\"format\":\"email\",\"minLength\":8,\"maxLength\":9}",
     {"\"ab@cd.ef\"", "\"abc@cd.ef\"", NULL},
     {"\"a@cd.ef\"", "\"abcd@cd.ef\"", NULL}},
    /* any characters but x, 2..4 of them: an escape (as a pattern writes them: \" \\ and
     * \u00XX for controls) and a UTF-8 character count one each */
    {"{\"type\":\"string\",\"pattern\":\"^[^x]*$\",\"minLength\":2,\"maxLength\":4}",
     {"\"ab\"", "\"\\\"\\u000a\"", "\"\xc3\xa9\xf0\x9f\x98\x80\\\\z\"",
      "\"\\\\\\u0009\xc3\xa9\xc3\xa9\"", NULL},
     {"\"a\"", "\"\xf0\x9f\x98\x80\"", "\"abcde\"", "\"\\\"\\u000a\\\\\xc3\xa9\xc3\xa9\"",
      "\"axb\"", NULL}},
    /* an unanchored pattern: a digit somewhere, at most 3 characters */
    {"{\"type\":\"string\",\"pattern\":\"[0-9]\",\"maxLength\":3}",
     {"\"7\"", "\"a1\xc3\xa9\"", "\"\xf0\x9f\x98\x80\\\"9\"", NULL},
     {"\"ab\"", "\"ab12\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\x31\"", "\"\\\\\\\\\\\\1\"", NULL}},
    /* date (always 10) with minLength 10: nothing to intersect, still a date */
    {"{\"type\":\"string\",\"format\":\"date\",\"minLength\":10}",
     {"\"2024-02-28\"", NULL},
     {"\"2024-02-30\"", "\"2024-2-28\"", NULL}},
    /* time (9..21 alone) with 14..15: the offset or a fraction */
    {"{\"type\":\"string\",\"format\":\"time\",\"minLength\":14,\"maxLength\":15}",
     {"\"12:00:00+02:00\"", "\"12:00:00.12345Z\"", NULL},
     {"\"12:00:00Z\"", "\"12:00:00.1+02:00\"", "\"12:00:00.123Z\"", NULL}},
    /* pattern and format: the UUIDs that start with 0 */
    {"{\"type\":\"string\",\"format\":\"uuid\",\"pattern\":\"^0\"}",
     {"\"023e4567-e89b-12d3-a456-426614174000\"", NULL},
     {"\"123e4567-e89b-12d3-a456-426614174000\"", "\"0\"", NULL}},
    /* pattern, format and lengths together; minLength alone */
    {"{\"type\":\"string\",\"format\":\"email\",\"pattern\":\"\\\\.org$\",\"maxLength\":8}",
     {"\"a@bc.org\"", "\"a@b.org\"", NULL},
     {"\"ab@cd.org\"", "\"a@bc.com\"", NULL}},
    /* inside a recursive rule (the intersection is built in the rule's own automaton) */
    {"{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"e\":{\"type\":\"string\","
     "\"format\":\"email\",\"maxLength\":7},\"next\":{\"$ref\":\"#/$defs/n\"}},\"required\":["
     "\"e\"]}},\"$ref\":\"#/$defs/n\"}",
     {"{\"e\":\"a@b.cd\"}", "{\"e\":\"a@b.cd\",\"next\":{\"e\":\"ab@c.de\"}}", NULL},
     {"{\"e\":\"a@b.cd\",\"next\":{\"e\":\"abc@d.ef\"}}", "{\"e\":\"abc@d.ef\"}", NULL}},
    {"{\"type\":\"string\",\"pattern\":\"^a+$\",\"minLength\":3}",
     {"\"aaa\"", "\"aaaaaaa\"", NULL},
     {"\"aa\"", "\"\"", NULL}},
};

START_TEST(combined_keywords) {
    kg_gvocab_t *v = byte_vocab();
    kg_grammar_t *g = compile(v, combined[_i].schema);
    for (int k = 0; k < 6 && combined[_i].good[k]; k++) {
        ck_assert_msg(accepts(g, combined[_i].good[k]), "schema %s refuses %s", combined[_i].schema,
                      combined[_i].good[k]);
    }
    for (int k = 0; k < 6 && combined[_i].bad[k]; k++) {
        ck_assert_msg(!accepts(g, combined[_i].bad[k]), "schema %s accepts %s", combined[_i].schema,
                      combined[_i].bad[k]);
    }
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

START_TEST(documents) {
    kg_gvocab_t *v = byte_vocab();
    kg_grammar_t *g = compile(v, cases[_i].schema);
    for (int k = 0; k < 4 && cases[_i].good[k]; k++) {
        ck_assert_msg(accepts(g, cases[_i].good[k]), "schema %d refuses %s", _i, cases[_i].good[k]);
    }
    for (int k = 0; k < 4 && cases[_i].bad[k]; k++) {
        ck_assert_msg(!accepts(g, cases[_i].bad[k]), "schema %d accepts %s", _i, cases[_i].bad[k]);
    }
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

START_TEST(unsupported_keywords) {
    static const struct {
        const char *schema, *want;
    } bad[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}",
         "unsupported JSON Schema keyword 'not' at /properties/a/not"},
        {"{\"if\":{},\"then\":{}}", "unsupported JSON Schema keyword"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"contentEncoding\":\"base64\"}}",
         "'contentEncoding' at /items/contentEncoding"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}",
         "'patternProperties' at /patternProperties"},
        {"{\"$defs\":{\"d\":{\"type\":\"integer\",\"multipleOf\":2}},\"$ref\":\"#/$defs/d\"}",
         "'multipleOf' at /$defs/d/multipleOf"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "unsupported format 'hostname'"},
        {"{\"$ref\":\"#/$defs/missing\"}", "no such location"},
        {"{\"type\":\"string\",\"pattern\":\"(?=x)\"}", "pattern at /pattern: regex"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":1001}",
         "maxLength 1001 together with pattern at (root): at most 1000 is supported"},
        {"{\"type\":\"string\",\"format\":\"email\",\"minLength\":2000}",
         "minLength/maxLength at (root) leave no string the format allows (its strings have 6 to "
         "72"},
        {"{\"type\":\"string\",\"format\":\"date\",\"maxLength\":9}", "have 10 to 10"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":2}", "minimum above maximum"},
        {"{\"type\":\"fish\"}", "unknown type 'fish'"},
        {"{\"anyOf\":[{}],\"type\":\"string\"}", "beside anyOf"},
        {"{\"allOf\":[{\"type\":\"string\"}]}", "allOf"},
        {"false", "nothing is valid"},
        {"[1]", "not an object or a boolean"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[512] = "";
        kg_gir_t *ir = kg_json_schema_gir(bad[i].schema, strlen(bad[i].schema), err, sizeof(err));
        ck_assert_msg(ir == NULL, "accepted %s", bad[i].schema);
        ck_assert_msg(strstr(err, bad[i].want) != NULL, "%s: got '%s', want '%s'", bad[i].schema,
                      err, bad[i].want);
    }
}
END_TEST

START_TEST(any_json_object) {
    kg_gvocab_t *v = byte_vocab();
    char err[256];
    kg_gir_t *ir = kg_json_object_gir(err, sizeof(err));
    ck_assert(ir != NULL);
    kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gir_free(ir);
    ck_assert(accepts(g, "{}"));
    ck_assert(accepts(g, "{\"a\":[1,{\"b\":null},\"c\"],\"d\":{\"e\":-1.5e-3}}"));
    ck_assert(!accepts(g, "[1]"));
    ck_assert(!accepts(g, "{\"a\":}"));
    ck_assert(!accepts(g, "{\"a\":1,}"));
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("json_schema");
    TCase *tc = tcase_create("grammar");
    tcase_add_loop_test(tc, documents, 0, (int)(sizeof(cases) / sizeof(cases[0])));
    tcase_add_loop_test(tc, combined_keywords, 0, (int)(sizeof(combined) / sizeof(combined[0])));
    tcase_add_test(tc, unsupported_keywords);
    tcase_add_test(tc, any_json_object);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
