/* fuzz_openai: arbitrary bytes through the OpenAI Batch output translator,
 * as kgen batch and kgen-submit use it: the bytes up to the first newline
 * are the input line, the rest the terminal event. A line that translates
 * must be a JSON object with a custom_id; a refusal must say why. Any crash,
 * leak or sanitizer report is a finding. (The input side, OpenAI lines and
 * bodies into jobs, is in fuzz_job: the job decoder reads every shape.) */
#include "schema/kg_openai.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *in = (const char *)data;
    const char *nl = memchr(in, '\n', size);
    size_t in_len = nl ? (size_t)(nl - in) : size;
    const char *ev = nl ? nl + 1 : in + size;
    size_t ev_len = size - in_len - (nl ? 1 : 0);
    kg_openai_output_opts_t o = {.default_model = "fuzz"};
    char *line = NULL, msg[128] = "", id[256];
    size_t len = 0;
    bool is_error = false;
    kg_status_t st = kg_openai_batch_output(in, in_len, ev, ev_len, &o, &line, &len, &is_error, msg,
                                            sizeof(msg));
    if (st != KG_OK) {
        check(line == NULL && (st == KG_ERR_INVALID || st == KG_ERR_NOMEM));
        check(st == KG_ERR_NOMEM || msg[0] != '\0');
        return 0;
    }
    check(line != NULL && len == strlen(line));
    check(kg_openai_line_id(line, len, id, sizeof(id)) || len > 0);
    (void)kg_openai_line_id(in, in_len, id, sizeof(id));
    free(line);
    return 0;
}
