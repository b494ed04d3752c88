/* kg_output: detokenize, hold back incomplete characters and possible stop
 * prefixes, cut at stop strings. */
#include "kg_output.h"

#include <stdlib.h>
#include <string.h>

void kg_output_init(kg_output_t *out,
                    const kg_tokenizer_t *tok,
                    const char *const *stop,
                    int32_t n_stop) {
    memset(out, 0, sizeof(*out));
    out->tok = tok;
    out->stop = stop;
    out->n_stop = n_stop;
    out->stop_index = -1;
}

void kg_output_keep(kg_output_t *out, const int32_t *ids, int32_t n) {
    out->n_keep = n < KG_OUTPUT_MAX_KEEP ? n : KG_OUTPUT_MAX_KEEP;
    memcpy(out->keep, ids, (size_t)out->n_keep * sizeof(*ids));
}

static bool kept(const kg_output_t *out, int32_t token) {
    for (int32_t i = 0; i < out->n_keep; i++) {
        if (out->keep[i] == token) {
            return true;
        }
    }
    return false;
}

void kg_output_think(kg_output_t *out, bool opened) {
    kg_think_init(&out->think, true, opened);
}

void kg_output_harmony(kg_output_t *out) {
    kg_think_init_harmony(&out->think);
}

void kg_output_split(const kg_output_t *out,
                     const char **answer,
                     size_t *answer_len,
                     const char **reasoning,
                     size_t *reasoning_len) {
    kg_think_split(&out->think, out->text ? out->text : "", out->len, answer, answer_len, reasoning,
                   reasoning_len);
}

void kg_output_clear(kg_output_t *out) {
    free(out->text);
    out->text = NULL;
    out->len = out->cap = 0;
}

static bool append(kg_output_t *out, const char *p, size_t n) {
    if (out->len + n + 1 > out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 256;
        while (cap < out->len + n + 1) {
            cap *= 2;
        }
        char *t = realloc(out->text, cap);
        if (!t) {
            return false;
        }
        out->text = t;
        out->cap = cap;
    }
    memcpy(out->text + out->len, p, n);
    out->len += n;
    out->text[out->len] = '\0';
    return true;
}

/* Bytes at the end of text[0, len) that start a UTF-8 character whose
 * continuation bytes have not arrived yet (0 when the text ends on a
 * boundary, or when the tail is invalid anyway and will not improve). */
static size_t incomplete_utf8_tail(const char *text, size_t len) {
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        unsigned char c = (unsigned char)text[len - back];
        if ((c & 0xC0) == 0x80) {
            continue; /* continuation byte: look further back */
        }
        size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* Longest suffix of text[from, len) that is a proper prefix of a stop string. */
static size_t stop_prefix_tail(const kg_output_t *out, size_t from) {
    size_t best = 0;
    for (int32_t i = 0; i < out->n_stop; i++) {
        size_t sl = strlen(out->stop[i]);
        size_t max = sl - 1 < out->len - from ? sl - 1 : out->len - from;
        for (size_t k = max; k > best; k--) {
            if (memcmp(out->text + out->len - k, out->stop[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

/* Earliest stop string occurrence starting at or after `from`: a stop can
 * only begin in text not yet released, since released text never ends
 * with a possible stop prefix. */
static bool find_stop(kg_output_t *out, size_t from, size_t *at) {
    *at = 0;
    bool found = false;
    for (int32_t i = 0; i < out->n_stop; i++) {
        size_t sl = strlen(out->stop[i]);
        if (sl == 0 || out->len - from < sl) {
            continue;
        }
        for (size_t p = from; p + sl <= out->len && (!found || p < *at); p++) {
            if (memcmp(out->text + p, out->stop[i], sl) == 0) {
                *at = p;
                out->stop_index = i;
                found = true;
                break;
            }
        }
    }
    return found;
}

int kg_output_push(kg_output_t *out,
                   int32_t token,
                   const kg_sample_result_t *sample,
                   kg_output_event_t ready[2]) {
    if (out->stop_index >= 0) {
        return 0;
    }
    int n_ready = 0;
    if (out->has_pending) {
        ready[n_ready++] = out->pending;
        out->has_pending = false;
    }
    char piece[256];
    bool special = kept(out, token);
    size_t n = kg_tokenizer_piece(out->tok, token, special, piece, sizeof(piece));
    if (n > sizeof(piece)) {
        char *big = malloc(n);
        if (!big) {
            return -1;
        }
        kg_tokenizer_piece(out->tok, token, special, big, n);
        bool ok = append(out, big, n);
        free(big);
        if (!ok) {
            return -1;
        }
    } else if (!append(out, piece, n)) {
        return -1;
    }

    kg_output_event_t ev = {.index = out->n_tokens++, .token_id = token, .text_off = out->released};
    if (sample) {
        ev.sample = *sample;
    }
    size_t at = 0;
    bool stopped = find_stop(out, out->released, &at);
    if (stopped) {
        out->len = at;
        out->text[at] = '\0';
    }
    /* after the cut: a stop string's text is in neither part */
    kg_think_scan(&out->think, out->text, out->len);
    ev.part = kg_think_part(&out->think, out->len);
    if (stopped) {
        ev.text_len = at - out->released;
        out->released = at;
        ready[n_ready++] = ev;
        return n_ready;
    }
    size_t hold = stop_prefix_tail(out, out->released);
    size_t utf8 = incomplete_utf8_tail(out->text, out->len - hold);
    size_t release_to = out->len - hold - utf8;
    ev.text_len = release_to - out->released;
    out->released = release_to;
    if (release_to < out->len) {
        out->pending = ev; /* text held back: the finish may append it here */
        out->has_pending = true;
    } else {
        ready[n_ready++] = ev;
    }
    return n_ready;
}

int kg_output_finish(kg_output_t *out, kg_output_event_t ready[1]) {
    if (!out->has_pending) {
        return 0;
    }
    out->pending.text_len += out->len - out->released;
    out->released = out->len;
    ready[0] = out->pending;
    out->has_pending = false;
    return 1;
}

bool kg_output_stopped(const kg_output_t *out) {
    return out->stop_index >= 0;
}

const char *kg_output_text(const kg_output_t *out, size_t *len) {
    *len = out->len;
    return out->text ? out->text : "";
}
