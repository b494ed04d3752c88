/* kg_answered: the answered-above list in offset commit metadata (kg_answered.h says why). */
#include "kg_answered.h"

#include <stdio.h>
#include <string.h>

size_t
kg_answered_encode(int64_t committed, const int64_t *offsets, size_t n, char *buf, size_t cap) {
    size_t limit = cap < KG_ANSWERED_MAX_BYTES + 1 ? cap : KG_ANSWERED_MAX_BYTES + 1;
    size_t pos = 0, n_done = 0;
    if (limit == 0) {
        return 0;
    }
    buf[0] = '\0';
    int k = snprintf(buf, limit, "%s", KG_ANSWERED_PREFIX);
    if (k < 0 || (size_t)k >= limit) {
        buf[0] = '\0';
        return 0;
    }
    pos = (size_t)k;
    int64_t prev = committed;
    for (size_t i = 0; i < n; i++) {
        if (offsets[i] <= prev) {
            continue;
        }
        char item[24];
        int m = snprintf(item, sizeof(item), "%s%lld", n_done ? "," : "",
                         (long long)(offsets[i] - committed));
        if (m < 0 || pos + (size_t)m >= limit) {
            break;
        }
        memcpy(buf + pos, item, (size_t)m + 1);
        pos += (size_t)m;
        prev = offsets[i];
        n_done++;
    }
    return n_done;
}

size_t kg_answered_item_bytes(int64_t committed, int64_t offset) {
    size_t digits = 1;
    for (int64_t d = offset - committed; d >= 10; d /= 10) {
        digits++;
    }
    return digits + 1;
}

size_t kg_answered_decode(const char *md, size_t len, int64_t committed, int64_t *out, size_t max) {
    size_t plen = strlen(KG_ANSWERED_PREFIX);
    if (!md || committed < 0 || len < plen || memcmp(md, KG_ANSWERED_PREFIX, plen) != 0) {
        return 0;
    }
    size_t n = 0, i = plen;
    int64_t prev = committed;
    while (i < len && n < max) {
        int64_t d = 0;
        size_t digits = 0;
        while (i < len && md[i] >= '0' && md[i] <= '9' && digits < 18) {
            d = d * 10 + (md[i] - '0');
            i++;
            digits++;
        }
        /* a delta of 1-18 digits, then a comma or the end; anything else ends the list */
        if (digits == 0 || (i < len && md[i] != ',') || d <= 0 || committed > INT64_MAX - d ||
            committed + d <= prev) {
            break;
        }
        out[n++] = prev = committed + d;
        i++; /* the comma */
    }
    return n;
}
