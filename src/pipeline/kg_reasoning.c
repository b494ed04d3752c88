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

void kg_think_scan(kg_think_t *t, const char *text, size_t len) {
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
