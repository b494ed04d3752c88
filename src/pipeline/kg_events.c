/* kg_events: job state -> contract events through the codec. */
#include "kg_events.h"

#include "../core/kg_clock.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void common(const kg_event_origin_t *o, const char *request_id, kg_event_common_t *c) {
    c->request_id = request_id;
    c->worker_id = o->worker_id;
    c->topic = o->topic;
    c->partition = o->partition;
    c->offset = o->offset;
    c->attempt = o->attempt;
    c->ts_ms = kg_clock_epoch_ms();
    c->has_span = o->span != NULL;
    if (o->span) {
        c->span = *o->span;
    }
}

void kg_events_attempt_id(uint64_t incarnation, uint64_t run, char *out, size_t size) {
    snprintf(out, size, "%016llx-%llu", (unsigned long long)incarnation, (unsigned long long)run);
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
                      int32_t choice,
                      const kg_output_t *out,
                      const kg_output_event_t *ev,
                      size_t max_bytes,
                      size_t *len,
                      kg_events_fit_t *fit) {
    size_t tlen;
    const char *text = kg_output_text(out, &tlen);
    kg_event_token_t e = {.has_choice = job->n > 1,
                          .choice = choice,
                          .index = ev->index,
                          .token_id = ev->token_id,
                          .text = text + ev->text_off,
                          .text_len = ev->text_len,
                          .part = ev->part};
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
    kg_events_choice_t ch = {
        .out = out, .reason = reason, .samples = samples, .n_samples = n_samples};
    return kg_events_done_choices(o, tok, job, &ch, 1, t, max_bytes, len, fit);
}

/* The per-token logprobs of one completion, with their pieces in *buf
 * (both malloc'ed; NULL, NULL when there are none). false on out of memory. */
static bool make_logprobs(const kg_tokenizer_t *tok,
                          const kg_sample_result_t *samples,
                          int32_t n_samples,
                          kg_token_logprobs_t **lps,
                          char **buf) {
    *lps = NULL;
    *buf = NULL;
    if (!samples || n_samples <= 0) {
        return true;
    }
    size_t cap = (size_t)n_samples * (KG_MAX_LOGPROBS + 1) * 64;
    *lps = calloc((size_t)n_samples, sizeof(**lps));
    *buf = malloc(cap);
    if (!*lps || !*buf) {
        free(*lps);
        free(*buf);
        *lps = NULL;
        *buf = NULL;
        return false;
    }
    size_t used = 0;
    for (int32_t i = 0; i < n_samples; i++) {
        fill_logprobs(tok, &samples[i], &(*lps)[i], *buf, cap, &used);
    }
    return true;
}

static const char *stop_of(const kg_job_t *job, const kg_events_choice_t *ch) {
    if (ch->reason == KG_FINISH_REASON_STOP_SEQUENCE && ch->out->stop_index >= 0) {
        return job->stop[ch->out->stop_index];
    }
    return NULL;
}

/* n > 1, still over budget with everything else shed: every choice's text
 * is cut to an equal share of the room left (each choice says how much). */
static char *cut_choice_texts(kg_event_done_t *e,
                              kg_event_choice_t *cs,
                              const kg_events_choice_t *ch,
                              int32_t n,
                              size_t max_bytes,
                              size_t *len,
                              kg_events_fit_t *got) {
    size_t full[KG_JOB_MAX_N], full_bytes[KG_JOB_MAX_N], kept_bytes;
    for (int32_t c = 0; c < n; c++) {
        full[c] = cs[c].text_len;
        kg_codec_text_prefix(cs[c].text, full[c], SIZE_MAX, &full_bytes[c]);
        cs[c].text_len = 0;
        cs[c].text_truncated = true;
        cs[c].text_bytes_cut = (int64_t)full_bytes[c];
    }
    char *json = kg_codec_encode_done(e, len);
    if (!json || *len > max_bytes) {
        return json;
    }
    /* a share each; the digits of text_bytes_cut only shrink as text is kept */
    size_t share = (max_bytes - *len) / (size_t)n;
    for (int32_t c = 0; c < n; c++) {
        size_t keep = kg_codec_text_prefix(cs[c].text, full[c], share, &kept_bytes);
        cs[c].text_len = keep;
        cs[c].text_bytes_cut = (int64_t)(full_bytes[c] - kept_bytes);
        cs[c].text_truncated = keep < full[c];
        if (cs[c].text_truncated) {
            got->text_bytes_cut += (size_t)cs[c].text_bytes_cut;
        }
    }
    (void)ch;
    free(json);
    return kg_codec_encode_done(e, len);
}

/* The answer of choice c parsed for tool calls (ch->toolfmt set; a job
 * without tools for its reasoning only, kg_toolcall_parse_answer): the calls
 * get ids where the model wrote none (call_ + the request's hash, the
 * choice and the call's index: a rerun of the job names them the same), and
 * a turn that ended in calls finishes "tool_calls". Out of memory: false. */
static bool parse_calls(const kg_job_t *job,
                        const kg_events_choice_t *ch,
                        int32_t c,
                        const char **text,
                        size_t *tlen,
                        kg_event_reasoning_t *r,
                        kg_toolparse_t *tp,
                        kg_finish_reason_t *reason) {
    if (ch->toolfmt == KG_TOOLFMT_NONE) {
        return true;
    }
    kg_status_t st;
    if (!job->tools_json || job->tool_choice == KG_TOOL_CHOICE_NONE) {
        st = kg_toolcall_parse_answer(ch->toolfmt, *text, *tlen, tp);
    } else if (job->reasoning_format == KG_REASONING_NONE) {
        st = kg_toolcall_parse_keep_reasoning(ch->toolfmt, *text, *tlen, job->tools_json, tp);
    } else {
        st = kg_toolcall_parse(ch->toolfmt, *text, *tlen, job->tools_json, tp);
    }
    if (st != KG_OK) {
        return false;
    }
    uint64_t h = kg_job_default_seed(job->request_id);
    for (size_t i = 0; i < tp->n_calls; i++) {
        if (tp->calls[i].id[0] == '\0') {
            char id[48];
            snprintf(id, sizeof(id), "call_%016" PRIx64 "%02x%02zx", h, (unsigned)c & 0xffu,
                     i & 0xffu);
            char *dup = strdup(id);
            if (!dup) {
                return false;
            }
            free(tp->calls[i].id);
            tp->calls[i].id = dup;
        }
    }
    *text = tp->content;
    *tlen = tp->content_len;
    if (!r->reasoning && tp->reasoning) {
        r->reasoning = tp->reasoning;
        r->reasoning_len = tp->reasoning_len;
    }
    if (tp->n_calls > 0 && *reason == KG_FINISH_REASON_STOP) {
        *reason = KG_FINISH_REASON_TOOL_CALLS;
    }
    return true;
}

char *kg_events_done_choices(const kg_event_origin_t *o,
                             const kg_tokenizer_t *tok,
                             const kg_job_t *job,
                             const kg_events_choice_t *ch,
                             int32_t n,
                             const kg_job_timing_t *t,
                             size_t max_bytes,
                             size_t *len,
                             kg_events_fit_t *fit) {
    if (n < 1 || n > KG_JOB_MAX_N) {
        return NULL;
    }
    size_t tlen;
    const char *text;
    kg_event_reasoning_t r0 = {0};
    kg_output_split(ch[0].out, &text, &tlen, &r0.reasoning, &r0.reasoning_len);
    kg_toolparse_t tps[KG_JOB_MAX_N];
    memset(tps, 0, sizeof(tps));
    kg_finish_reason_t reason0 = ch[0].reason;
    if (!parse_calls(job, &ch[0], 0, &text, &tlen, &r0, &tps[0], &reason0)) {
        kg_toolparse_clear(&tps[0]);
        return NULL;
    }
    const size_t r0_full = r0.reasoning_len;
    int64_t first = t->first_token_us ? t->first_token_us : t->finished_us;
    double gen_s = (double)(t->finished_us - first) / 1e6;
    int32_t n_gen = 0;
    for (int32_t c = 0; c < n; c++) {
        n_gen += ch[c].out->n_tokens;
    }
    kg_event_done_t e = {.finish_reason = reason0,
                         .text = text,
                         .text_len = tlen,
                         .r = r0,
                         .prompt_tokens = t->n_prompt,
                         .completion_tokens = n_gen,
                         .cached_tokens = t->n_cached,
                         .queue_ms = (double)(t->submitted_us - t->taken_us) / 1e3,
                         .ttft_ms = (double)(first - t->taken_us) / 1e3,
                         .total_ms = (double)(t->finished_us - t->taken_us) / 1e3,
                         .tokens_per_s = n_gen > 1 && gen_s > 0 ? (n_gen - 1) / gen_s : 0.0,
                         .metadata_json = job->metadata_json,
                         .model = job->model ? job->model : o->model,
                         .tool_calls = tps[0].calls,
                         .n_tool_calls = tps[0].n_calls};
    e.stop = stop_of(job, &ch[0]);
    e.stop_len = e.stop ? strlen(e.stop) : 0;
    common(o, job->request_id, &e.common);
    kg_token_logprobs_t *lps[KG_JOB_MAX_N] = {0};
    char *bufs[KG_JOB_MAX_N] = {0};
    kg_event_choice_t cs[KG_JOB_MAX_N];
    char *json = NULL;
    kg_events_fit_t got = {0};
    for (int32_t c = 0; c < n; c++) {
        if (!make_logprobs(tok, ch[c].samples, ch[c].n_samples, &lps[c], &bufs[c])) {
            goto out;
        }
    }
    if (n == 1) {
        e.logprobs = lps[0];
        e.n_logprobs = lps[0] ? ch[0].n_samples : 0;
    } else {
        for (int32_t c = 0; c < n; c++) {
            size_t clen;
            cs[c] = (kg_event_choice_t){.index = c,
                                        .finish_reason = ch[c].reason,
                                        .completion_tokens = ch[c].out->n_tokens,
                                        .logprobs = lps[c],
                                        .n_logprobs = lps[c] ? ch[c].n_samples : 0};
            kg_output_split(ch[c].out, &cs[c].text, &clen, &cs[c].r.reasoning,
                            &cs[c].r.reasoning_len);
            if (c == 0) {
                cs[c].text = text; /* parsed above */
                clen = tlen;
                cs[c].r = r0;
                cs[c].finish_reason = reason0;
            } else if (!parse_calls(job, &ch[c], c, &cs[c].text, &clen, &cs[c].r, &tps[c],
                                    &cs[c].finish_reason)) {
                goto out;
            }
            cs[c].tool_calls = tps[c].calls;
            cs[c].n_tool_calls = tps[c].n_calls;
            cs[c].text_len = clen;
            cs[c].stop = stop_of(job, &ch[c]);
            cs[c].stop_len = cs[c].stop ? strlen(cs[c].stop) : 0;
        }
        e.choices = cs;
        e.n_choices = n;
    }
    /* shed in the documented order until it fits: logprobs, metadata, text */
    json = kg_codec_encode_done(&e, len);
    bool has_lp = e.logprobs != NULL;
    for (int32_t c = 0; n > 1 && c < n; c++) {
        has_lp |= cs[c].logprobs != NULL;
    }
    if (!fits(json, *len, max_bytes) && has_lp) {
        free(json);
        e.logprobs = NULL;
        e.n_logprobs = 0;
        for (int32_t c = 0; n > 1 && c < n; c++) {
            cs[c].logprobs = NULL;
            cs[c].n_logprobs = 0;
        }
        e.logprobs_truncated = got.logprobs_dropped = true;
        json = kg_codec_encode_done(&e, len);
    }
    if (!fits(json, *len, max_bytes) && e.metadata_json) {
        free(json);
        e.metadata_json = NULL;
        e.metadata_truncated = got.metadata_dropped = true;
        json = kg_codec_encode_done(&e, len);
    }
    /* the reasoning goes before the answer: cut from its end, as the text is */
    if (!fits(json, *len, max_bytes) && n == 1 && e.r.reasoning) {
        free(json);
        json = cut_text(encode_done, &e, e.r.reasoning, r0_full, &e.r.reasoning_len,
                        &e.r.reasoning_truncated, &e.r.reasoning_bytes_cut, max_bytes, len);
        got.reasoning_bytes_cut = (size_t)e.r.reasoning_bytes_cut;
    }
    if (!fits(json, *len, max_bytes) && n > 1) {
        free(json);
        for (int32_t c = 0; c < n; c++) {
            if (cs[c].r.reasoning && cs[c].r.reasoning_len > 0) {
                size_t bytes;
                kg_codec_text_prefix(cs[c].r.reasoning, cs[c].r.reasoning_len, SIZE_MAX, &bytes);
                cs[c].r.reasoning_len = 0;
                cs[c].r.reasoning_truncated = true;
                cs[c].r.reasoning_bytes_cut = (int64_t)bytes;
                got.reasoning_bytes_cut += bytes;
            }
        }
        json = kg_codec_encode_done(&e, len);
    }
    if (!fits(json, *len, max_bytes)) {
        free(json);
        json = cut_text(encode_done, &e, text, tlen, &e.text_len, &e.text_truncated,
                        &e.text_bytes_cut, max_bytes, len);
        got.text_bytes_cut = (size_t)e.text_bytes_cut;
    }
    if (n > 1 && !fits(json, *len, max_bytes)) {
        free(json);
        json = cut_choice_texts(&e, cs, ch, n, max_bytes, len, &got);
    }
out:
    for (int32_t c = 0; c < n; c++) {
        free(lps[c]);
        free(bufs[c]);
        kg_toolparse_clear(&tps[c]);
    }
    note_fit(fit, &got, json ? *len : 0, max_bytes);
    return json;
}

char *kg_events_done_answer(const kg_event_origin_t *o,
                            const kg_job_t *job,
                            const kg_events_answer_t *a,
                            const kg_job_timing_t *t,
                            size_t max_bytes,
                            size_t *len,
                            kg_events_fit_t *fit,
                            bool *too_big) {
    kg_event_done_t e = {.finish_reason = KG_FINISH_REASON_STOP,
                         .text = "",
                         .prompt_tokens = t->n_prompt,
                         .queue_ms = (double)(t->submitted_us - t->taken_us) / 1e3,
                         .ttft_ms = (double)(t->finished_us - t->taken_us) / 1e3,
                         .total_ms = (double)(t->finished_us - t->taken_us) / 1e3,
                         .metadata_json = job->metadata_json,
                         .model = job->model ? job->model : o->model,
                         .embeddings = a->embd,
                         .n_embeddings = a->embd ? a->n_embd : 0,
                         .embedding_dim = a->dim,
                         .embeddings_base64 = job->base64,
                         .has_results = a->results != NULL,
                         .results = a->results,
                         .n_results = a->n_results};
    common(o, job->request_id, &e.common);
    kg_events_fit_t got = {0};
    *too_big = false;
    char *json = kg_codec_encode_done(&e, len);
    if (!fits(json, *len, max_bytes) && e.metadata_json) {
        free(json);
        e.metadata_json = NULL;
        e.metadata_truncated = got.metadata_dropped = true;
        json = kg_codec_encode_done(&e, len);
    }
    if (!fits(json, *len, max_bytes)) {
        /* a vector cut short is a wrong vector: no answer rather than that */
        free(json);
        json = NULL;
        *too_big = true;
    }
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
    return kg_events_error_text(o, request_id, code, message, metadata_json, NULL, 0, max_bytes,
                                len, fit);
}

char *kg_events_error_text(const kg_event_origin_t *o,
                           const char *request_id,
                           kg_error_code_t code,
                           const char *message,
                           const char *metadata_json,
                           const char *text,
                           size_t text_len,
                           size_t max_bytes,
                           size_t *len,
                           kg_events_fit_t *fit) {
    kg_event_error_t e = {.code = code,
                          .message = message,
                          .metadata_json = metadata_json,
                          .text = text,
                          .text_len = text_len};
    common(o, request_id, &e.common);
    kg_events_fit_t got = {0};
    char *json = kg_codec_encode_error(&e, len);
    if (!fits(json, *len, max_bytes) && e.metadata_json) {
        free(json);
        e.metadata_json = NULL;
        e.metadata_truncated = got.metadata_dropped = true;
        json = encode_error(&e, len);
    }
    if (!fits(json, *len, max_bytes) && text) {
        free(json);
        json = cut_text(encode_error, &e, text, text_len, &e.text_len, &e.text_truncated,
                        &e.text_bytes_cut, max_bytes, len);
        got.text_bytes_cut = (size_t)e.text_bytes_cut;
    }
    note_fit(fit, &got, json ? *len : 0, max_bytes);
    return json;
}
