/* fuzz_toolcall: arbitrary bytes as a model's answer, parsed as tool calls in every format (the
 * first byte picks the format, so one input reaches each parser). A parse always gives content
 * (its length within the text's); a malformed one gives back the whole text and no calls; a call
 * has a name, an id and arguments. Any crash, leak or sanitizer report is a finding. */
#include "schema/kg_toolcall.h"

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

static const char tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                            "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\"},"
                            "\"n\":{\"type\":\"number\"}}}}}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) {
        return 0;
    }
    kg_toolfmt_t f = (kg_toolfmt_t)(data[0] % (KG_TOOLFMT_LAST + 1));
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    kg_toolparse_t p;
    if (kg_toolcall_parse(f, text, len, tools, &p) != KG_OK) {
        return 0; /* out of memory only */
    }
    check(p.content != NULL && p.content_len <= len && p.content[p.content_len] == '\0');
    check(!p.reasoning || p.reasoning[p.reasoning_len] == '\0');
    if (p.malformed) {
        check(p.n_calls == 0);
        check(p.content_len == len && memcmp(p.content, text, len) == 0);
    }
    for (size_t i = 0; i < p.n_calls; i++) {
        check(p.calls[i].name != NULL && p.calls[i].arguments != NULL && p.calls[i].id != NULL);
    }
    kg_toolparse_clear(&p);
    return 0;
}
