/* fuzz_answered: arbitrary bytes as an offset commit's metadata (any client of the group may
 * commit any string), the committed offset taken from the first 8 bytes. What decodes is
 * ascending and above the committed offset, and encodes back to metadata that decodes to the
 * same offsets. Any crash, leak or sanitizer report is a finding. */
#include "kafka/kg_answered.h"

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
    int64_t committed = 0;
    if (size >= 8) {
        memcpy(&committed, data, 8);
        committed = committed < 0 ? -(committed + 1) : committed;
        committed %= (int64_t)1 << 40;
        data += 8;
        size -= 8;
    }
    static int64_t out[KG_ANSWERED_MAX_BYTES], again[KG_ANSWERED_MAX_BYTES];
    size_t n = kg_answered_decode((const char *)data, size, committed, out, KG_ANSWERED_MAX_BYTES);
    for (size_t i = 0; i < n; i++) {
        check(out[i] > (i ? out[i - 1] : committed));
    }
    static char md[KG_ANSWERED_MAX_BYTES + 1];
    size_t m = kg_answered_encode(committed, out, n, md, sizeof(md));
    check(m <= n && strlen(md) <= KG_ANSWERED_MAX_BYTES);
    check(kg_answered_decode(md, strlen(md), committed, again, KG_ANSWERED_MAX_BYTES) == m);
    check(memcmp(out, again, m * sizeof(out[0])) == 0);
    return 0;
}
