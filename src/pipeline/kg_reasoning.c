/* kg_reasoning: the <think>...</think> split of an output (see kg_reasoning.h). */
#include "kg_reasoning.h"

#include <string.h>

static bool is_space(char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

void kg_think_init(kg_think_t *t, bool on, bool opened) {
    memset(t, 0, sizeof(*t));
    t->state = !on ? KG_THINK_OFF : opened ? KG_THINK_IN : KG_THINK_UNDECIDED;
}

/* Look for </think> from t->scanned; a match may straddle the last scan's end. */
static void find_close(kg_think_t *t, const char *text, size_t len) {
    const size_t cl = sizeof(KG_THINK_CLOSE) - 1;
    size_t from = t->scanned > t->r_off + cl ? t->scanned - cl : t->r_off;
    for (size_t p = from; p + cl <= len; p++) {
        if (memcmp(text + p, KG_THINK_CLOSE, cl) == 0) {
            t->state = KG_THINK_CLOSED;
            t->r_end = p;
            t->a_off = p + cl;
            return;
        }
    }
    t->scanned = len;
}

void kg_think_init_harmony(kg_think_t *t) {
    memset(t, 0, sizeof(*t));
    t->state = KG_THINK_OFF; /* the <think> split stays off: the text is split by its parse */
    t->harmony = true;
}

/* Where `lit` starts in text[from, len), or len. */
static size_t find_lit(const char *text, size_t len, size_t from, const char *lit) {
    const size_t n = strlen(lit);
    for (size_t p = from; p + n <= len; p++) {
        if (memcmp(text + p, lit, n) == 0) {
            return p;
        }
    }
    return len;
}

/* A header [h, m) read as kg_toolcall's parse reads it: an analysis message's body is reasoning,
 * unless the header names a recipient (a call's arguments: the answer's, as other syntaxes'
 * calls are). The channel is the header's last (gpt-oss may prefix a stray one). */
static bool analysis_header(const char *text, size_t h, size_t m) {
    static const char ch[] = "<|channel|>", an[] = "analysis";
    if (find_lit(text, m, h, "to=functions.") < m) {
        return false;
    }
    size_t last = m;
    for (size_t c = find_lit(text, m, h, ch); c < m; c = find_lit(text, m, c + 1, ch)) {
        last = c;
    }
    size_t w = last + sizeof(ch) - 1;
    return last < m && w + sizeof(an) - 1 <= m && memcmp(text + w, an, sizeof(an) - 1) == 0;
}

static const char *const harmony_ends[] = {"<|end|>", "<|call|>", "<|return|>"};

/* Where a call's body ends, scanning on from t->scanned: the first end marker outside its
 * JSON's strings (so an <|end|> a string holds is the arguments', as the parse reads them), or
 * len with t->scanned left where a marker may start that the text has not finished. */
static size_t call_body_end(kg_think_t *t, const char *text, size_t len, size_t *e_len) {
    size_t i = t->scanned;
    for (; i < len; i++) {
        if (t->in_str) {
            bool escaped = t->esc;
            t->esc = !escaped && text[i] == '\\';
            t->in_str = escaped || text[i] != '"';
            continue;
        }
        for (int k = 0; k < 3; k++) {
            size_t n = strlen(harmony_ends[k]), have = len - i < n ? len - i : n;
            if (memcmp(text + i, harmony_ends[k], have) == 0) {
                if (have < n) {
                    t->scanned = i; /* perhaps a marker: wait for the rest */
                    return len;
                }
                *e_len = n;
                t->scanned = i;
                return i;
            }
        }
        t->in_str = text[i] == '"';
    }
    t->scanned = len;
    return len;
}

/* The Harmony scan: from where the last one stopped (a marker may straddle its end). */
static void harmony_scan(kg_think_t *t, const char *text, size_t len) {
    static const char msg[] = "<|message|>";
    const char *const *ends = harmony_ends;
    if (len < t->seen) { /* a stop string cut text already scanned: read it again */
        kg_think_init_harmony(t);
    }
    t->seen = len;
    for (;;) {
        switch (t->hs) {
        case KG_HARMONY_START: {
            static const char *const opens[] = {"<|channel|>", " to="};
            bool prefix = false;
            for (int i = 0; i < 2; i++) {
                size_t n = strlen(opens[i]);
                if (len >= n && memcmp(text, opens[i], n) == 0) {
                    t->hs = KG_HARMONY_HEADER;
                    t->h_off = t->scanned = 0;
                    break;
                }
                prefix = prefix || (len < n && memcmp(text, opens[i], len) == 0);
            }
            if (t->hs == KG_HARMONY_START) {
                t->partial = len > 0 && prefix;
                t->hs = len > 0 && !prefix ? KG_HARMONY_NONE : KG_HARMONY_START;
                return;
            }
            break;
        }
        case KG_HARMONY_HEADER: {
            const size_t back = sizeof(msg) - 2;
            size_t from = t->scanned > t->h_off + back ? t->scanned - back : t->h_off;
            size_t m = find_lit(text, len, from, msg);
            if (m == len) {
                t->scanned = len;
                return;
            }
            t->body_reasoning = analysis_header(text, t->h_off, m);
            t->body_call = find_lit(text, m, t->h_off, "to=functions.") < m;
            t->in_str = t->esc = false;
            t->hs = KG_HARMONY_BODY;
            t->b_off = t->scanned = m + sizeof(msg) - 1;
            break;
        }
        case KG_HARMONY_BODY: {
            size_t e = len, e_len = 0;
            if (t->body_call) {
                e = call_body_end(t, text, len, &e_len);
            } else {
                const size_t back = sizeof("<|return|>") - 2;
                size_t from = t->scanned > t->b_off + back ? t->scanned - back : t->b_off;
                for (int i = 0; i < 3; i++) {
                    size_t at = find_lit(text, len, from, ends[i]);
                    if (at < e) {
                        e = at, e_len = strlen(ends[i]);
                    }
                }
                t->scanned = e;
            }
            if (e == len) {
                return;
            }
            /* what follows (<|start|>assistant, the next header) is the next message's header */
            t->hs = KG_HARMONY_HEADER;
            t->h_off = t->scanned = e + e_len;
            break;
        }
        default:
            return;
        }
    }
}

/* The part of a token whose text ends at `end` (the scan covered it): a body's when it ends
 * inside the body, past its header's <|message|>. */
static kg_token_part_t harmony_part(const kg_think_t *t, size_t end) {
    switch (t->hs) {
    case KG_HARMONY_START:
        return t->partial ? KG_PART_REASONING : KG_PART_ANSWER;
    case KG_HARMONY_HEADER:
        return KG_PART_REASONING;
    case KG_HARMONY_BODY:
        return t->body_reasoning || end <= t->b_off ? KG_PART_REASONING : KG_PART_ANSWER;
    default:
        return KG_PART_ANSWER;
    }
}

void kg_think_scan(kg_think_t *t, const char *text, size_t len) {
    if (t->harmony) {
        harmony_scan(t, text, len);
        return;
    }
    if (t->state == KG_THINK_UNDECIDED) {
        const size_t ol = sizeof(KG_THINK_OPEN) - 1;
        size_t i = 0;
        while (i < len && is_space(text[i])) {
            i++;
        }
        size_t rest = len - i;
        t->partial = rest > 0;
        if (rest >= ol && memcmp(text + i, KG_THINK_OPEN, ol) == 0) {
            t->state = KG_THINK_IN;
            t->r_off = t->scanned = i + ol;
        } else if (rest > 0 && (rest >= ol || memcmp(text + i, KG_THINK_OPEN, rest) != 0)) {
            t->state = KG_THINK_NONE;
        }
    }
    if (t->state == KG_THINK_IN) {
        find_close(t, text, len);
    }
}

kg_token_part_t kg_think_part(const kg_think_t *t, size_t end) {
    if (t->harmony) {
        return harmony_part(t, end);
    }
    switch (t->state) {
    case KG_THINK_OFF:
        return KG_PART_NONE;
    case KG_THINK_IN:
        return KG_PART_REASONING;
    case KG_THINK_CLOSED:
        return end <= t->a_off ? KG_PART_REASONING : KG_PART_ANSWER;
    case KG_THINK_UNDECIDED:
        /* whitespace alone is answer-side; a partial <think> is the thought's */
        return t->partial && end > 0 ? KG_PART_REASONING : KG_PART_ANSWER;
    default:
        return KG_PART_ANSWER;
    }
}

void kg_think_split(const kg_think_t *t,
                    const char *text,
                    size_t len,
                    const char **answer,
                    size_t *answer_len,
                    const char **reasoning,
                    size_t *reasoning_len) {
    *answer = text;
    *answer_len = len;
    *reasoning = NULL;
    *reasoning_len = 0;
    size_t r_off = t->r_off < len ? t->r_off : len;
    if (t->state == KG_THINK_IN) {
        *reasoning = text + r_off;
        *reasoning_len = len - r_off;
        *answer = text + len;
        *answer_len = 0;
    } else if (t->state == KG_THINK_CLOSED) {
        size_t end = t->r_end < len ? t->r_end : len;
        size_t a = t->a_off < len ? t->a_off : len;
        *reasoning = text + r_off;
        *reasoning_len = end > r_off ? end - r_off : 0;
        *answer = text + a;
        *answer_len = len - a;
    }
}

bool kg_think_prompt_opens(const char *prompt, size_t len) {
    const size_t ol = sizeof(KG_THINK_OPEN) - 1;
    while (len > 0 && is_space(prompt[len - 1])) {
        len--;
    }
    return len >= ol && memcmp(prompt + len - ol, KG_THINK_OPEN, ol) == 0;
}
