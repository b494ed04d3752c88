/* fuzz_job: arbitrary bytes through the job decoder (and the event
 * decoder, which must not crash on them either). A job that decodes
 * must re-encode, decode again to the same encoding, render its messages
 * with a chat template, and echo its metadata in events; a rejection must
 * come with a kind and a message. Any crash, leak or sanitizer report is a
 * finding. */
#include "schema/kg_chat.h"
#include "schema/kg_codec.h"
#include "schema/kg_codec_event.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
    if (!ok) {
        abort();
    }
}

static void exercise_events(const kg_job_t *job) {
    kg_event_error_t er = {.common = {.request_id = job->request_id,
                                      .worker_id = "fuzz",
                                      .partition = job->partition,
                                      .offset = job->offset},
                           .code = KG_ERROR_INVALID_JOB,
                           .message = "m",
                           .metadata_json = job->metadata_json};
    size_t len;
    char *out = kg_codec_encode_error(&er, &len);
    check(out != NULL);
    char err[128];
    kg_event_t *ev = NULL;
    check(kg_codec_decode_event(out, len, &ev, err, sizeof(err)) == KG_OK);
    check((ev->error.metadata_json == NULL) == (job->metadata_json == NULL));
    kg_event_free(ev);
    free(out);

    // The prompt bytes as token text: any bytes must encode.
    kg_event_token_t tok = {.common = er.common, .text = job->prompt, .text_len = job->prompt_len};
    out = kg_codec_encode_token(&tok, &len);
    check(out != NULL);
    check(kg_codec_decode_event(out, len, &ev, err, sizeof(err)) == KG_OK);
    kg_event_free(ev);
    free(out);
}

static void exercise_chat(const kg_job_t *job) {
    static const char *const tmpls[] = {"chatml", "llama2-sys", "gemma", "mistral-v3", "llama3"};
    if (job->prompt_kind != KG_PROMPT_MESSAGES) {
        return;
    }
    char err[128];
    char *out = NULL;
    const char *tmpl = tmpls[job->n_messages % 5];
    check(kg_chat_render(tmpl, job->messages, (size_t)job->n_messages, true, NULL, NULL, &out, err,
                         sizeof(err)) == KG_OK);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kg_job_t *job = NULL;
    kg_job_t *again = NULL;
    kg_codec_error_t err;
    /* the same bytes as an event, as kgen-submit reads the results topic
     * (embeddings as numbers or base64, results): decoded or refused */
    kg_event_t *ev = NULL;
    char ev_err[128];
    if (kg_codec_decode_event((const char *)data, size, &ev, ev_err, sizeof(ev_err)) == KG_OK) {
        kg_event_free(ev);
    }
    kg_status_t st = kg_codec_decode_job((const char *)data, size, &job, &err);
    if (st != KG_OK) {
        check(job == NULL && st == KG_ERR_INVALID);
        check(err.kind == KG_CODEC_DLQ || err.kind == KG_CODEC_INVALID);
        check(err.message[0] != '\0');
        return 0;
    }
    size_t len, len2;
    char *enc = kg_codec_encode_job(job, &len);
    check(enc != NULL);
    check(kg_codec_decode_job(enc, len, &again, &err) == KG_OK);
    char *enc2 = kg_codec_encode_job(again, &len2);
    check(enc2 != NULL && len == len2 && memcmp(enc, enc2, len) == 0);
    exercise_events(job);
    exercise_chat(job);
    free(enc);
    free(enc2);
    kg_job_free(again);
    kg_job_free(job);
    return 0;
}
