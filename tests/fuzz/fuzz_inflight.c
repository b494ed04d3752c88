/* fuzz_inflight: arbitrary bytes through the in-flight snapshot decoder (a
 * record of the poison-job journal, read back from Kafka). A snapshot that
 * decodes must re-encode to text that decodes to the same snapshot, and
 * give inheritable strikes; a rejection must come with a message. Any
 * crash, leak or sanitizer report is a finding. */
#include "schema/kg_inflight.h"

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
    kg_inflight_t s, again;
    char err[256] = "";
    kg_status_t st = kg_inflight_decode((const char *)data, size, &s, err, sizeof(err));
    if (st != KG_OK) {
        check(st == KG_ERR_INVALID && err[0] != '\0' && s.runs == NULL);
        return 0;
    }
    size_t len;
    char *enc = kg_inflight_encode(&s, &len);
    check(enc != NULL);
    check(kg_inflight_decode(enc, len, &again, err, sizeof(err)) == KG_OK);
    check(again.n_runs == s.n_runs && again.epoch == s.epoch && again.seq == s.seq &&
          again.clean == s.clean && strcmp(again.worker_id, s.worker_id) == 0);
    for (size_t i = 0; i < s.n_runs; i++) {
        check(again.runs[i].offset == s.runs[i].offset && again.runs[i].count == s.runs[i].count &&
              again.runs[i].strikes == s.runs[i].strikes &&
              again.runs[i].started == s.runs[i].started &&
              again.runs[i].level == s.runs[i].level && again.runs[i].alone == s.runs[i].alone &&
              again.runs[i].solo == s.runs[i].solo);
    }
    kg_inflight_run_t *runs;
    size_t n;
    check(kg_inflight_inherit(&s, (int64_t)(size % 7) - 1, &runs, &n) == KG_OK);
    check(n <= s.n_runs);
    free(runs);
    free(enc);
    kg_inflight_clear(&again);
    kg_inflight_clear(&s);
    return 0;
}
