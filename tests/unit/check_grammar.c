/* check_grammar: the grammar engine (src/grammar): GBNF and regex parsing,
 * compilation, the matcher's masks against token-by-token acceptance,
 * jump-forward, and generated texts against independent checkers (PCRE2
 * for regexes, a small JSON parser for llama.cpp's JSON grammars). The
 * grammars llama.cpp ships (tests/data/grammars) parse and compile as they
 * are: existing GBNF files work. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "check_common.h"
#include "grammar/kg_constraint.h"
#include "grammar/kg_gbnf.h"
#include "grammar/kg_grammar.h"
#include "grammar/kg_grammar_cache.h"
#include "grammar/kg_regex.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- a small vocabulary: every byte, plus multi-byte tokens ----

static const char *const extra_tokens[] = {
    "ab",  "abc", "\"",   "\",",  "{\"",  "\":",  "true", "null",     "12",   "  ",
    "\n ", "é",   "\xc3", "\xa9", "ca",   "cat",  "dog",  "\"}",      "},",   "[1",
    ", ",  "0.",  "-1",   "\\n",  "\\\"", "name", "age",  "\"name\"", "\": ", "aa",
    "aaa", "ba",  "+",    "(1",   "1)",   "2*",   "zz",   "yes",      "no",   "maybe",
};
#define N_EXTRA ((int32_t)(sizeof(extra_tokens) / sizeof(extra_tokens[0])))
#define N_VOCAB (256 + N_EXTRA + 1) /* the last id has no text (like an EOS) */

static kg_gvocab_t *test_vocab(void) {
    static char bytes[256][1];
    const char *texts[N_VOCAB];
    size_t lens[N_VOCAB];
    for (int i = 0; i < 256; i++) {
        bytes[i][0] = (char)i;
        texts[i] = bytes[i];
        lens[i] = 1;
    }
    for (int i = 0; i < N_EXTRA; i++) {
        texts[256 + i] = extra_tokens[i];
        lens[256 + i] = strlen(extra_tokens[i]);
    }
    texts[N_VOCAB - 1] = "";
    lens[N_VOCAB - 1] = 0;
    char err[256];
    kg_gvocab_t *v = kg_gvocab_new_raw(texts, lens, N_VOCAB, err, sizeof(err));
    ck_assert_msg(v != NULL, "%s", err);
    return v;
}

static kg_grammar_t *compile_gbnf(kg_gvocab_t *v, const char *text, char *err, size_t n) {
    kg_gir_t *ir = kg_gir_new();
    kg_grammar_t *g = NULL;
    if (kg_gbnf_parse(ir, text, strlen(text), err, n)) {
        g = kg_grammar_compile(ir, v, err, n);
    }
    kg_gir_free(ir);
    return g;
}

static kg_grammar_t *must_gbnf(kg_gvocab_t *v, const char *text) {
    char err[256] = "";
    kg_grammar_t *g = compile_gbnf(v, text, err, sizeof(err));
    ck_assert_msg(g != NULL, "grammar failed: %s\n%s", err, text);
    return g;
}

static bool bit(const uint32_t *mask, int32_t id) {
    return (mask[id >> 5] >> (id & 31)) & 1u;
}

/* xorshift for reproducible walks */
static uint64_t rnd(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Under a sanitizer, each step checks every CHECK_STRIDE-th token against
 * acceptance (a different residue each step, so every token is checked along
 * a walk): copying and stepping a matcher for all ~300 tokens at every step
 * of 40 walks of 200 steps costs a minute under ASan and finds nothing a
 * quarter of it would not; the plain build checks them all. */
#ifdef KG_TEST_SANITIZED
#define CHECK_STRIDE 4
#else
#define CHECK_STRIDE 1
#endif

/* The precomputed mask must equal token-by-token acceptance, at every
 * step of random walks; walks end when the grammar allows the end (with
 * some probability) or is done. Writes the texts of the walks. */
static int random_walks(
    kg_grammar_t *g, kg_gvocab_t *v, int n_walks, int max_steps, uint64_t seed, char texts[][512]) {
    kg_matcher_t *m = kg_matcher_new(), *t = kg_matcher_new();
    uint32_t mask[(N_VOCAB + 31) / 32];
    int32_t allowed[N_VOCAB];
    int ended = 0;
    for (int w = 0; w < n_walks; w++) {
        kg_matcher_reset(m, g);
        size_t len = 0;
        texts[w][0] = '\0';
        for (int step = 0; step < max_steps; step++) {
            bool any = kg_matcher_fill_mask(m, mask);
            for (int32_t id = step % CHECK_STRIDE; id < N_VOCAB; id += CHECK_STRIDE) {
                kg_matcher_copy(t, m);
                bool ok = kg_matcher_accept(t, id);
                ck_assert_msg(ok == bit(mask, id), "walk %d step %d token %d: mask %d accept %d", w,
                              step, id, bit(mask, id), ok);
            }
            int32_t n_allowed = 0;
            for (int32_t id = 0; id < N_VOCAB; id++) {
                if (bit(mask, id)) {
                    allowed[n_allowed++] = id;
                }
            }
            ck_assert_int_eq(any, n_allowed > 0);
            int32_t forced = kg_matcher_forced(m);
            if (forced >= 0) {
                ck_assert(bit(mask, forced));
                ck_assert(!kg_matcher_can_end(m));
            }
            if (kg_matcher_is_done(m) || n_allowed == 0) {
                ck_assert(kg_matcher_can_end(m));
                ended++;
                break;
            }
            if (kg_matcher_can_end(m) && rnd(&seed) % 4 == 0) {
                ended++;
                break;
            }
            int32_t id = forced >= 0 ? forced : allowed[rnd(&seed) % (uint64_t)n_allowed];
            ck_assert(kg_matcher_accept(m, id));
            size_t tl = (size_t)(v->off[id + 1] - v->off[id]);
            if (len + tl < 511) {
                memcpy(texts[w] + len, v->bytes + v->off[id], tl);
                len += tl;
                texts[w][len] = '\0';
            }
        }
        if (!kg_matcher_can_end(m)) {
            texts[w][0] = '\x01'; /* unfinished: not checked */
        }
    }
    kg_matcher_free(m);
    kg_matcher_free(t);
    return ended;
}

// ---- parsing ----

START_TEST(gbnf_errors) {
    kg_gvocab_t *v = test_vocab();
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"root ::= \"a", "unterminated literal"},
        {"root ::= [a-", "unterminated character class"},
        {"root ::= foo", "undefined rule 'foo'"},
        {"rot ::= \"a\"", "no rule named 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= (\"a\"", "expecting ')'"},
        {"root ::= \"a\"{3,1}", "max below min"},
        {"root ::= * \"a\"", "expecting an item"},
        {"root ::= <think>", "token references"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= root \"a\" | \"b\"", "left recursion"},
        {"root ::= \"a\" x\nx ::= x \"b\"", "cannot match any text"},
        {"root ::= [z-a]", "out of order"},
        {"root ::= \"a\" ::= \"b\"", "line 1"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[256] = "";
        kg_grammar_t *g = compile_gbnf(v, cases[i].text, err, sizeof(err));
        ck_assert_msg(g == NULL, "accepted: %s", cases[i].text);
        ck_assert_msg(strstr(err, cases[i].want) != NULL, "'%s': got '%s', want '%s'",
                      cases[i].text, err, cases[i].want);
    }
    kg_gvocab_unref(v);
}
END_TEST

START_TEST(regex_errors) {
    static const struct {
        const char *re, *want;
    } cases[] = {
        {"(?=a)b", "lookaround"},       {"a\\1", "backreferences"},  {"\\bword", "word boundaries"},
        {"a(b", "missing )"},           {"a)b", "unmatched )"},      {"[a-", "unterminated"},
        {"*a", "nothing to repeat"},    {"a{5,2}", "max below min"}, {"(?i)a", "inline flags"},
        {"\\p{L}", "Unicode property"}, {"a^b", "anchors"},          {"a++", "possessive"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kg_gir_t *ir = kg_gir_new();
        char err[256] = "";
        kg_regex_opts_t o = {0};
        int32_t e = kg_regex_to_gir(ir, cases[i].re, strlen(cases[i].re), &o, err, sizeof(err));
        ck_assert_msg(e < 0, "accepted: %s", cases[i].re);
        ck_assert_msg(strstr(err, cases[i].want) != NULL, "'%s': got '%s'", cases[i].re, err);
        kg_gir_free(ir);
    }
}
END_TEST

// ---- masks and matching ----

static const char *const grammars[] = {
    /* JSON-like, recursive */
    "root ::= value\n"
    "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\"\n"
    "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\"\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\nt] )* \"\\\"\"\n"
    "number ::= \"-\"? [0-9]+ (\".\" [0-9]+)?\n"
    "ws ::= [ \\n]?\n",
    /* arithmetic */
    "root ::= expr\n"
    "expr ::= term ((\"+\" | \"-\") term)*\n"
    "term ::= factor ((\"*\" | \"/\") factor)*\n"
    "factor ::= [0-9]+ | \"(\" expr \")\"\n",
    /* nested parentheses, two calls in one rule */
    "root ::= p\np ::= \"(\" p p \")\" | \"\"\n",
    /* ambiguous alternatives and repetition counts */
    "root ::= (\"a\" | \"ab\" | \"aa\")* \"b\"{1,3} ([x-z] | \"é\")?\n",
    /* right recursion with a nullable callee */
    "root ::= list\nlist ::= item (\",\" list)?\nitem ::= opt \"ca\" [a-t]?\nopt ::= \"dog\"?\n",
    /* comments, newlines in groups, any character, classes with escapes */
    "# a comment\nroot ::= (  \"yes\"\n  | \"no\" # why\n | \"maybe\" ) . [\\x41-\\x43\\]]\n",
};

START_TEST(masks_match_acceptance) {
    kg_gvocab_t *v = test_vocab();
    const char *text = grammars[_i];
    kg_grammar_t *g = must_gbnf(v, text);
    static char texts[40][512];
    int ended = random_walks(g, v, 40, 60, 0x9e3779b97f4a7c15ull + (uint64_t)_i, texts);
    ck_assert_msg(ended > 0, "no walk of grammar %d finished", _i);
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

START_TEST(arithmetic_texts_are_valid) {
    /* a hand-checked property of the arithmetic grammar: balanced brackets,
     * operators between operands */
    kg_gvocab_t *v = test_vocab();
    kg_grammar_t *g = must_gbnf(v, grammars[1]);
    static char texts[60][512];
    random_walks(g, v, 60, 40, 7, texts);
    int checked = 0;
    for (int w = 0; w < 60; w++) {
        if (texts[w][0] == '\x01') {
            continue;
        }
        int depth = 0;
        bool operand = false;
        for (const char *p = texts[w]; *p; p++) {
            if (*p == '(') {
                ck_assert(!operand);
                depth++;
            } else if (*p == ')') {
                ck_assert(operand);
                depth--;
                ck_assert_int_ge(depth, 0);
            } else if (strchr("+-*/", *p)) {
                ck_assert_msg(operand, "%s", texts[w]);
                operand = false;
            } else {
                ck_assert_msg(*p >= '0' && *p <= '9', "%s", texts[w]);
                operand = true;
            }
        }
        ck_assert_int_eq(depth, 0);
        ck_assert(operand);
        checked++;
    }
    ck_assert_int_gt(checked, 10);
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

static const char *const regexes[] = {
    "[a-z]+@[a-z]+\\.(com|org)",
    "\\d{3}-\\d{4}",
    "(ab|cd)*e?",
    "^(yes|no|maybe)$",
    "[^\"]{2,5}x",
    "\\w+ \\w+",
    "é+|ca(t|b)",
    "\\s?-?\\d+(\\.\\d{1,2})?",
    "[\\u00e0-\\u00ff]{1,3}",
    "a{0,2}b{2}c?",
};

START_TEST(regex_outputs_full_match) {
    kg_gvocab_t *v = test_vocab();
    const char *re = regexes[_i];
    char err[256] = "";
    kg_gir_t *ir = kg_constraint_regex(re, strlen(re), err, sizeof(err));
    ck_assert_msg(ir != NULL, "%s", err);
    kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s: %s", re, err);
    kg_gir_free(ir);
    static char texts[50][512];
    random_walks(g, v, 50, 30, 11 + (uint64_t)_i, texts);
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *code = pcre2_compile(
        (PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED,
        PCRE2_UTF | PCRE2_ALT_BSUX | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &errcode, &erroff, NULL);
    ck_assert(code != NULL);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    int checked = 0;
    for (int w = 0; w < 50; w++) {
        if (texts[w][0] == '\x01') {
            continue;
        }
        int rc = pcre2_match(code, (PCRE2_SPTR)texts[w], strlen(texts[w]), 0, 0, md, NULL);
        ck_assert_msg(rc > 0, "/%s/ does not match '%s'", re, texts[w]);
        checked++;
    }
    ck_assert_int_gt(checked, 0);
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

START_TEST(choice_and_forcing) {
    kg_gvocab_t *v = test_vocab();
    const char *items[] = {"positive", "negative", "neutral"};
    size_t lens[] = {8, 8, 7};
    char err[256];
    kg_gir_t *ir = kg_constraint_choice(items, lens, 3, err, sizeof(err));
    ck_assert(ir != NULL);
    kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    kg_gir_free(ir);
    kg_matcher_t *m = kg_matcher_new();
    kg_matcher_reset(m, g);
    ck_assert_int_eq(kg_matcher_forced(m), -1); /* p or n */
    ck_assert(kg_matcher_accept(m, 'n'));
    ck_assert(kg_matcher_accept(m, 'e'));
    ck_assert_int_eq(kg_matcher_forced(m), -1); /* g or u */
    ck_assert(kg_matcher_accept(m, 'u'));
    /* "tral" is forced: the longest token spelling its start is 't' */
    ck_assert_int_eq(kg_matcher_forced(m), 't');
    ck_assert(!kg_matcher_accept(m, 'x'));
    ck_assert(kg_matcher_accept(m, 't'));
    ck_assert(kg_matcher_accept(m, 'r'));
    ck_assert(kg_matcher_accept(m, 'a'));
    ck_assert(!kg_matcher_can_end(m));
    ck_assert(kg_matcher_accept(m, 'l'));
    ck_assert(kg_matcher_is_done(m));
    uint32_t mask[(N_VOCAB + 31) / 32];
    ck_assert(!kg_matcher_fill_mask(m, mask));
    kg_matcher_free(m);
    kg_grammar_unref(g);

    /* a multi-byte forced token: after {" the key is forced */
    g = must_gbnf(v, "root ::= \"{\\\"name\\\": \" [0-9]\n");
    m = kg_matcher_new();
    kg_matcher_reset(m, g);
    int32_t f = kg_matcher_forced(m);
    ck_assert_int_eq(f, 256 + 4); /* {" */
    ck_assert(kg_matcher_accept(m, f));
    f = kg_matcher_forced(m);
    ck_assert_int_eq(f, 256 + 25); /* name (the next forced bytes are name": ) */
    kg_matcher_free(m);
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

START_TEST(cache_lru) {
    kg_gvocab_t *v = test_vocab();
    /* a budget just above the largest grammar: the next miss evicts it */
    kg_grammar_t *probe = must_gbnf(v, grammars[0]);
    size_t one = kg_grammar_memory(probe);
    kg_grammar_unref(probe);
    kg_grammar_cache_t *c = kg_grammar_cache_new(v, one + 600);
    char err[256];
    kg_constraint_t k1 = {
        .kind = KG_CONSTRAINT_GRAMMAR, .text = grammars[0], .len = strlen(grammars[0])};
    kg_constraint_t k2 = {.kind = KG_CONSTRAINT_REGEX, .text = "[a-z]+", .len = 6};
    kg_constraint_t k3 = {
        .kind = KG_CONSTRAINT_GRAMMAR, .text = grammars[1], .len = strlen(grammars[1])};
    kg_constraint_t bad = {.kind = KG_CONSTRAINT_REGEX, .text = "(a", .len = 2};
    kg_grammar_t *a = kg_grammar_cache_get(c, &k1, NULL, err, sizeof(err));
    kg_grammar_t *b = kg_grammar_cache_get(c, &k1, NULL, err, sizeof(err));
    ck_assert(a != NULL && a == b);
    kg_grammar_unref(b);
    kg_grammar_cache_stats_t st;
    kg_grammar_cache_stats(c, &st);
    ck_assert_int_eq(st.hits, 1);
    ck_assert_int_eq(st.misses, 1);
    kg_grammar_t *x = kg_grammar_cache_get(c, &k2, NULL, err, sizeof(err));
    kg_grammar_t *y = kg_grammar_cache_get(c, &k3, NULL, err, sizeof(err));
    ck_assert(x && y);
    kg_grammar_cache_stats(c, &st);
    ck_assert_uint_le(st.bytes, one + 600 + kg_grammar_memory(y) + 4096);
    ck_assert_int_ge(st.evictions, 1);
    /* the evicted grammar stays usable through the reference we hold */
    kg_matcher_t *m = kg_matcher_new();
    kg_matcher_reset(m, a);
    ck_assert(kg_matcher_accept(m, 't'));
    kg_matcher_free(m);
    /* errors are cached too, with their message */
    ck_assert(kg_grammar_cache_get(c, &bad, NULL, err, sizeof(err)) == NULL);
    ck_assert(strstr(err, "missing )") != NULL);
    err[0] = '\0';
    ck_assert(kg_grammar_cache_get(c, &bad, NULL, err, sizeof(err)) == NULL);
    ck_assert(strstr(err, "missing )") != NULL);
    kg_grammar_cache_stats(c, &st);
    ck_assert_int_eq(st.hits, 2);
    kg_grammar_unref(a);
    kg_grammar_unref(x);
    kg_grammar_unref(y);
    kg_grammar_cache_free(c);
    kg_gvocab_unref(v);
}
END_TEST

// ---- llama.cpp's own grammar files ----

static const char *const llama_grammars[] = {
    "arithmetic", "c", "chess", "english", "japanese", "json", "json_arr", "list",
};

/* A JSON checker independent of the grammar engine (RFC 8259 values; the
 * grammar's whitespace is a subset of JSON's). Returns the end of the value
 * at p, or NULL. Not jansson: it refuses numbers a double cannot hold
 * (12e+541), which JSON's grammar, and so json.gbnf, allows. */
static const char *json_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') {
        p++;
    }
    return p;
}

static const char *json_value(const char *p, int depth);

static const char *json_string(const char *p) {
    if (*p++ != '"') {
        return NULL;
    }
    while (*p != '"') {
        if ((unsigned char)*p < 0x20) {
            return NULL;
        }
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++) {
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || p[i] == '\0') {
                        return NULL;
                    }
                }
                p += 4;
            } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                return NULL;
            }
        }
        p++;
    }
    return p + 1;
}

static const char *json_number(const char *p) {
    const char *s = p;
    if (*p == '-') {
        p++;
    }
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (*p >= '0' && *p <= '9') {
            p++;
        }
    } else {
        return NULL;
    }
    if (*p == '.') {
        if (!(*++p >= '0' && *p <= '9')) {
            return NULL;
        }
        while (*p >= '0' && *p <= '9') {
            p++;
        }
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') {
            p++;
        }
        if (!(*p >= '0' && *p <= '9')) {
            return NULL;
        }
        while (*p >= '0' && *p <= '9') {
            p++;
        }
    }
    return p > s ? p : NULL;
}

static const char *json_list(const char *p, char close, int depth, bool members) {
    p = json_ws(p + 1);
    if (*p == close) {
        return p + 1;
    }
    for (;;) {
        if (members) {
            if (!(p = json_string(p))) {
                return NULL;
            }
            p = json_ws(p);
            if (*p++ != ':') {
                return NULL;
            }
        }
        if (!(p = json_value(json_ws(p), depth + 1))) {
            return NULL;
        }
        p = json_ws(p);
        if (*p == close) {
            return p + 1;
        }
        if (*p++ != ',') {
            return NULL;
        }
        p = json_ws(p);
    }
}

static const char *json_value(const char *p, int depth) {
    if (depth > 64) {
        return NULL;
    }
    switch (*p) {
    case '{':
        return json_list(p, '}', depth, true);
    case '[':
        return json_list(p, ']', depth, false);
    case '"':
        return json_string(p);
    case 't':
        return strncmp(p, "true", 4) == 0 ? p + 4 : NULL;
    case 'f':
        return strncmp(p, "false", 5) == 0 ? p + 5 : NULL;
    case 'n':
        return strncmp(p, "null", 4) == 0 ? p + 4 : NULL;
    default:
        return json_number(p);
    }
}

static bool json_valid(const char *text) {
    const char *end = json_value(json_ws(text), 0);
    return end && *json_ws(end) == '\0';
}

/* Every grammar file llama.cpp ships parses and compiles unchanged, and
 * its masks equal token-by-token acceptance along random walks; the texts
 * of finished walks of the JSON grammars are JSON, and those of list.gbnf
 * are "- " items, one a line. */
START_TEST(llama_cpp_grammars) {
    char path[64];
    snprintf(path, sizeof(path), "grammars/%s.gbnf", llama_grammars[_i]);
    char *text = kg_test_read_file(kg_test_data(path), NULL);
    ck_assert_msg(text != NULL, "cannot read %s", path);
    kg_gvocab_t *v = test_vocab();
    char err[256] = "";
    kg_grammar_t *g = compile_gbnf(v, text, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s.gbnf: %s", llama_grammars[_i], err);
    free(text);
    static char texts[40][512];
    const int ended = random_walks(g, v, 40, 200, 0x5eed0000ull + (uint64_t)_i, texts);
    ck_assert_msg(ended > 0, "no walk of %s.gbnf finished", llama_grammars[_i]);
    const bool json = strncmp(llama_grammars[_i], "json", 4) == 0;
    const bool list = strcmp(llama_grammars[_i], "list") == 0;
    int checked = 0;
    for (int w = 0; w < 40 && (json || list); w++) {
        const size_t len = strlen(texts[w]);
        if (texts[w][0] == '\x01' || len == 0 || len >= 500) {
            continue; /* unfinished, or cut at the buffer's end */
        }
        if (list && texts[w][len - 1] != '\n') {
            continue; /* an item holds a NUL byte (list.gbnf allows it): cut as a C string */
        }
        if (json) {
            ck_assert_msg(json_valid(texts[w]), "%s.gbnf made invalid JSON: %s", llama_grammars[_i],
                          texts[w]);
        } else {
            for (const char *line = texts[w]; *line; line = strchr(line, '\n') + 1) {
                ck_assert_msg(strncmp(line, "- ", 2) == 0 && strchr(line, '\n') != NULL &&
                                  strchr(line, '\n') > line + 2,
                              "not a list item (%zu bytes, line at %td): %s", len, line - texts[w],
                              texts[w]);
            }
        }
        checked++;
    }
    if (json || list) {
        ck_assert_msg(checked >= 3, "%s.gbnf: only %d texts checked", llama_grammars[_i], checked);
    }
    kg_grammar_unref(g);
    kg_gvocab_unref(v);
}
END_TEST

// ---- intersections (KG_GX_AND) ----

static bool accepts_text(kg_grammar_t *g, const char *text) {
    kg_matcher_t *m = kg_matcher_new();
    kg_matcher_reset(m, g);
    bool ok = true;
    for (const unsigned char *p = (const unsigned char *)text; *p && ok; p++) {
        ok = kg_matcher_accept(m, *p); /* ids 0..255 are the single bytes */
    }
    ok = ok && kg_matcher_can_end(m);
    kg_matcher_free(m);
    return ok;
}

/* Texts of (a|b|é)* that end in b, 2..3 characters (é is two bytes, one
 * character); masks agree with acceptance; a recursive side is refused;
 * the length range of an expression is read from its structure. */
START_TEST(intersection) {
    kg_gvocab_t *v = test_vocab();
    kg_gir_t *ir = kg_gir_new();
    uint32_t lo[3] = {'a', 'b', 0xE9}, hi[3] = {'a', 'b', 0xE9};
    int32_t any = kg_gir_chars(ir, lo, hi, 3, false);
    int32_t ends_b =
        kg_gir_seq2(ir, kg_gir_repeat(ir, any, 0, KG_GIR_UNBOUNDED), kg_gir_bytes(ir, "b", 1));
    int32_t root = kg_gir_rule(ir, "root", 4);
    kg_gir_define(ir, root, kg_gir_and(ir, ends_b, kg_gir_repeat(ir, any, 2, 3)));
    kg_gir_set_root(ir, root);
    char err[256] = "";
    kg_grammar_t *g = kg_grammar_compile(ir, v, err, sizeof(err));
    ck_assert_msg(g != NULL, "%s", err);
    /* é is \xc3\xa9, b is \x62 (a hex escape would swallow a plain b) */
    static const char *const good[] = {"ab", "bb", "\xc3\xa9\x62", "aab", "\xc3\xa9\xc3\xa9\x62"};
    static const char *const bad[] = {"b", "ba", "abab", "\xc3\xa9\xc3\xa9\xc3\xa9\x62", "aa"};
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++) {
        ck_assert_msg(accepts_text(g, good[i]), "refuses %s", good[i]);
        ck_assert_msg(!accepts_text(g, bad[i]), "accepts %s", bad[i]);
    }
    static char texts[8][512];
    ck_assert_int_gt(random_walks(g, v, 8, 8, 7, texts), 0);
    kg_grammar_unref(g);
    int64_t mn, mx;
    ck_assert(kg_gir_text_length(ir, ends_b, &mn, &mx) && mn == 1 && mx == -1);
    ck_assert(kg_gir_text_length(ir, kg_gir_rule_expr(ir, root), &mn, &mx) && mn == 2 && mx == 3);
    /* nested counts that would overflow: a true range, at least 10^15, no upper bound */
    static const char deep[] = "(((a{10000}){10000}){10000}){10000}";
    kg_regex_opts_t o = {0};
    int32_t e = kg_regex_to_gir(ir, deep, strlen(deep), &o, err, sizeof(err));
    ck_assert(kg_gir_text_length(ir, e, &mn, &mx) && mn == 1000000000000000LL && mx == -1);
    kg_gir_free(ir);

    ir = kg_gir_new();
    int32_t r = kg_gir_rule(ir, "r", 1);
    int32_t alts[2] = {
        kg_gir_seq3(ir, kg_gir_bytes(ir, "(", 1), kg_gir_ref(ir, r), kg_gir_bytes(ir, ")", 1)),
        kg_gir_empty(ir)};
    kg_gir_define(ir, r, kg_gir_alt(ir, alts, 2));
    root = kg_gir_rule(ir, "root", 4);
    kg_gir_define(ir, root, kg_gir_and(ir, kg_gir_ref(ir, r), kg_gir_bytes(ir, "()", 2)));
    kg_gir_set_root(ir, root);
    ck_assert(kg_grammar_compile(ir, v, err, sizeof(err)) == NULL);
    ck_assert_msg(strstr(err, "intersection cannot use a recursive rule"), "%s", err);
    ck_assert(!kg_gir_text_length(ir, kg_gir_rule_expr(ir, root), &mn, &mx));
    kg_gir_free(ir);
    kg_gvocab_unref(v);
}
END_TEST

static Suite *make_suite(void) {
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, gbnf_errors);
    tcase_add_test(tc, regex_errors);
    suite_add_tcase(s, tc);
    tc = tcase_create("match");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, masks_match_acceptance, 0,
                        (int)(sizeof(grammars) / sizeof(grammars[0])));
    tcase_add_test(tc, arithmetic_texts_are_valid);
    tcase_add_loop_test(tc, regex_outputs_full_match, 0,
                        (int)(sizeof(regexes) / sizeof(regexes[0])));
    tcase_add_test(tc, choice_and_forcing);
    tcase_add_test(tc, intersection);
    tcase_add_loop_test(tc, llama_cpp_grammars, 0,
                        (int)(sizeof(llama_grammars) / sizeof(llama_grammars[0])));
    suite_add_tcase(s, tc);
    tc = tcase_create("cache");
    tcase_add_test(tc, cache_lru);
    suite_add_tcase(s, tc);
    return s;
}

KG_CHECK_MAIN(make_suite)
