/* fuzz_cancel: arbitrary bytes as the value of a cancel message (the key is the first byte's
 * worth of the input, so empty values are read by their key too). A cancel that decodes names
 * a request_id of the contract and re-encodes to a message that decodes to the same id; a
 * rejection comes with a reason. Any crash, leak or sanitizer report is a finding. */
#include "schema/kg_cancelmsg.h"

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
    size_t key_len = size > 0 ? data[0] % 140 : 0;
    key_len = key_len < size ? key_len : (size > 0 ? size - 1 : 0);
    const uint8_t *key = size > 0 ? data + 1 : NULL;
    const uint8_t *value = size > 0 ? data + 1 + key_len : NULL;
    size_t len = size > 0 ? size - 1 - key_len : 0;
    char rid[KG_JOB_REQUEST_ID_MAX + 1], again[KG_JOB_REQUEST_ID_MAX + 1], why[160] = "";
    kg_status_t st = kg_cancelmsg_decode(key, key_len, value, len, rid, why, sizeof(why));
    if (st != KG_OK) {
        check(st == KG_ERR_INVALID && why[0] != '\0');
        return 0;
    }
    size_t n = strlen(rid);
    check(n >= 1 && n <= KG_JOB_REQUEST_ID_MAX);
    size_t elen;
    char *enc = kg_cancelmsg_encode(rid, &elen);
    check(enc != NULL);
    check(kg_cancelmsg_decode(NULL, 0, enc, elen, again, why, sizeof(why)) == KG_OK);
    check(strcmp(rid, again) == 0);
    free(enc);
    return 0;
}
