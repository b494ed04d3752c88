/* kg_events: job state -> contract events through the codec. */
#include "kg_events.h"

#include "../core/kg_clock.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void common(const kg_event_origin_t *o, const char *request_id, kg_event_common_t *c) {
    c->request_id = request_id;
    c->worker_id = o->worker_id;
    c->topic = o->topic;
    c->partition = o->partition;
    c->offset = o->offset;
    c->ts_ms = kg_clock_epoch_ms();
}

/* Pieces of the chosen and top tokens, copied into `buf` (so the entries
 * can point into it); a piece that does not fit is left empty. */
static void fill_logprobs(const kg_tokenizer_t *tok,
                          const kg_sample_result_t *s,
                          kg_token_logprobs_t *lp,
                          char *buf,
                          size_t cap,
                          size_t *used) {
    memset(lp, 0, sizeof(*lp));
    lp->n_top = s->n_top;
    for (int32_t i = -1; i < s->n_top; i++) {
        kg_logprob_entry_t *e = i < 0 ? &lp->token : &lp->top[i];
        e->token_id = i < 0 ? s->token : s->top_token[i];
        e->logprob = i < 0 ? s->logprob : s->top_logprob[i];
        size_t room = cap - *used;
        size_t n = kg_tokenizer_piece(tok, e->token_id, true, buf + *used, room);
        if (n > room) {
            n = 0;
        }
        e->text = buf + *used;
        e->text_len = n;
        *used += n;
    }
}

// ---- fitting an event to its budget ----

typedef char *(*encode_fn)(const void *ev, size_t *len);

static char *encode_token(const void *ev, size_t *len) {
    return kg_codec_encode_token(ev, len);
}

static char *encode_done(const void *ev, size_t *len) {
    return kg_codec_encode_done(ev, len);
}

static char *encode_error(const void *ev, size_t *len) {
    return kg_codec_encode_error(ev, len);
}

/* Re-encode with the end of the text cut until the event fits max_bytes.
 * `text` (full bytes) is the event's text; *text_len, *truncated and *cut
 * are the event's own fields; *cut counts the UTF-8 bytes a reader misses
 * (kg_codec_text_prefix). Returns the encoded event (NULL on out of
 * memory); it is above max_bytes only when it is even with no text. */
static char *cut_text(encode_fn encode,
                      const void *ev,
                      const char *text,
                      size_t full,
                      size_t *text_len,
                      bool *truncated,
                      int64_t *cut,
                      size_t max_bytes,
                      size_t *len) {
    size_t full_bytes, kept_bytes;
    kg_codec_text_prefix(text, full, SIZE_MAX, &full_bytes);
    *truncated = true;
    *text_len = 0;
    *cut = (int64_t)full_bytes;
    char *json = encode(ev, len);
    if (!json || *len > max_bytes) {
        return json;
    }
    /* the room the text may take; exact but for the digits of *cut, which
     * only shrink as more text is kept */
    size_t room = max_bytes - *len;
    for (int i = 0; i < 4 && room > 0; i++) {
        size_t keep = kg_codec_text_prefix(text, full, room, &kept_bytes);
        if (keep == 0) {
            break;
        }
        *text_len = keep;
        *cut = (int64_t)(full_bytes - kept_bytes);
        char *longer = encode(ev, len);
        if (!longer || *len <= max_bytes) {
            free(json);
            return longer;
        }
        free(longer);
        room = room > *len - max_bytes ? room - (*len - max_bytes) : 0;
    }
    *text_len = 0;
    *cut = (int64_t)full_bytes;
    free(json);
    return encode(ev, len);
}

static bool fits(const char *json, size_t len, size_t max_bytes) {
    return !json || max_bytes == 0 || len <= max_bytes;
}

static void note_fit(kg_events_fit_t *fit, const kg_events_fit_t *got, size_t len, size_t max) {
    if (fit) {
        *fit = *got;
        fit->over_budget = max > 0 && len > max;
    }
}

// ---- the events ----

char *kg_events_token(const kg_event_origin_t *o,
                      const kg_tokenizer_t *tok,
                      const kg_job_t *job,
                      const kg_output_t *out,
                      const kg_output_event_t *ev,
                      size_t max_bytes,
                      size_t *len,
                      kg_events_fit_t *fit) {
    size_t tlen;
    const char *text = kg_output_text(out, &tlen);
    kg_event_token_t e = {.index = ev->index,
                          .token_id = ev->token_id,
                          .text = text + ev->text_off,
                          .text_len = ev->text_len};
    common(o, job->request_id, &e.common);
    char buf[(KG_MAX_LOGPROBS + 1) * 256];
    size_t used = 0;
    if (job->sampling.n_logprobs > 0) {
        e.has_logprobs = true;
        fill_logprobs(tok, &ev->sample, &e.logprobs, buf, sizeof(buf), &used);
    }
    kg_events_fit_t got = {0};
    char *json = kg_codec_encode_token(&e, len);
    if (!fits(json, *len, max_bytes) && e.has_logprobs) {
        free(json);
        e.has_logprobs = false;
        e.logprobs_truncated = got.logprobs_dropped = true;
        json = kg_codec_encode_token(&e, len);
    }
    if (!fits(json, *len, max_bytes)) {
        free(json);
        json = cut_text(encode_token, &e, e.text, ev->text_len, &e.text_len, &e.text_truncated,
                        &e.text_bytes_cut, max_bytes, len);
        got.text_bytes_cut = (size_t)e.text_bytes_cut;
    }
    note_fit(fit, &got, json ? *len : 0, max_bytes);
    return json;
}

char *kg_events_done(const kg_event_origin_t *o,
                     const kg_tokenizer_t *tok,
                     const kg_job_t *job,
                     const kg_output_t *out,
                     kg_finish_reason_t reason,
                     const kg_job_timing_t *t,
                     const kg_sample_result_t *samples,
                     int32_t n_samples,
                     size_t max_bytes,
                     size_t *len,
                     kg_events_fit_t *fit) {
    size_t tlen;
    const char *text = kg_output_text(out, &tlen);
    int64_t first = t->first_token_us ? t->first_token_us : t->finished_us;
    double gen_s = (double)(t->finished_us - first) / 1e6;
    int32_t n_gen = out->n_tokens;
    kg_event_done_t e = {.finish_reason = reason,
                         .text = text,
                         .text_len = tlen,
                         .prompt_tokens = t->n_prompt,
                         .completion_tokens = n_gen,
                         .cached_tokens = t->n_cached,
                         .queue_ms = (double)(t->submitted_us - t->taken_us) / 1e3,
                         .ttft_ms = (double)(first - t->taken_us) / 1e3,
                         .total_ms = (double)(t->finished_us - t->taken_us) / 1e3,
                         .tokens_per_s = n_gen > 1 && gen_s > 0 ? (n_gen - 1) / gen_s : 0.0,
                         .metadata_json = job->metadata_json};
    if (reason == KG_FINISH_REASON_STOP_SEQUENCE && out->stop_index >= 0) {
        e.stop = job->stop[out->stop_index];
        e.stop_len = strlen(e.stop);
    }
    common(o, job->request_id, &e.common);
    kg_token_logprobs_t *lps = NULL;
    char *buf = NULL;
    if (samples && n_samples > 0) {
        size_t cap = (size_t)n_samples * (KG_MAX_LOGPROBS + 1) * 64;
        lps = calloc((size_t)n_samples, sizeof(*lps));
        buf = malloc(cap);
        if (!lps || !buf) {
            free(lps);
            free(buf);
            return NULL;
        }
        size_t used = 0;
        for (int32_t i = 0; i < n_samples; i++) {
            fill_logprobs(tok, &samples[i], &lps[i], buf, cap, &used);
        }
        e.logprobs = lps;
        e.n_logprobs = n_samples;
    }
    /* shed in the documented order until it fits: logprobs, metadata, text */
    kg_events_fit_t got = {0};
    char *json = kg_codec_encode_done(&e, len);
    if (!fits(json, *len, max_bytes) && e.logprobs) {
        free(json);
        e.logprobs = NULL;
        e.n_logprobs = 0;
        e.logprobs_truncated = got.logprobs_dropped = true;
        json = kg_codec_encode_done(&e, len);
    }
    if (!fits(json, *len, max_bytes) && e.metadata_json) {
        free(json);
        e.metadata_json = NULL;
        e.metadata_truncated = got.metadata_dropped = true;
        json = kg_codec_encode_done(&e, len);
    }
    if (!fits(json, *len, max_bytes)) {
        free(json);
        json = cut_text(encode_done, &e, text, tlen, &e.text_len, &e.text_truncated,
                        &e.text_bytes_cut, max_bytes, len);
        got.text_bytes_cut = (size_t)e.text_bytes_cut;
    }
    free(lps);
    free(buf);
    note_fit(fit, &got, json ? *len : 0, max_bytes);
    return json;
}

char *kg_events_error(const kg_event_origin_t *o,
                      const char *request_id,
                      kg_error_code_t code,
                      const char *message,
                      const char *metadata_json,
                      size_t max_bytes,
                      size_t *len,
                      kg_events_fit_t *fit) {
    kg_event_error_t e = {.code = code, .message = message, .metadata_json = metadata_json};
    common(o, request_id, &e.common);
    kg_events_fit_t got = {0};
    char *json = kg_codec_encode_error(&e, len);
    if (!fits(json, *len, max_bytes) && e.metadata_json) {
        free(json);
        e.metadata_json = NULL;
        e.metadata_truncated = got.metadata_dropped = true;
        json = encode_error(&e, len);
    }
    note_fit(fit, &got, json ? *len : 0, max_bytes);
    return json;
}
