/* kg_parse: strict values from text; see kg_parse.h. */
#include "kg_parse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool kg_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max) {
        return false;
    }
    *out = v;
    return true;
}

bool kg_parse_f32(const char *s, float min, float max, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < min || v > max) {
        return false;
    }
    *out = v;
    return true;
}

/* RFC 9110 tchar: what a header name made of one token may hold. */
static bool is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool names_has(const kg_header_names_t *hn, const char *name, size_t n) {
    for (int i = 0; i < hn->n; i++) {
        if (strlen(hn->name[i]) == n && memcmp(hn->name[i], name, n) == 0) {
            return true;
        }
    }
    return false;
}

bool kg_parse_header_names(const char *list,
                           kg_header_names_t *out,
                           char *errstr,
                           size_t errstr_size) {
    out->n = 0;
    for (const char *p = list ? list : ""; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *s = p;
        while (len > 0 && *s == ' ') {
            s++;
            len--;
        }
        while (len > 0 && s[len - 1] == ' ') {
            len--;
        }
        bool token = len > 0 && len <= KG_HEADER_NAME_MAX;
        for (size_t i = 0; token && i < len; i++) {
            token = is_tchar((unsigned char)s[i]);
        }
        if (!token) {
            snprintf(errstr, errstr_size,
                     "expected header names (1 to %d letters, digits or !#$%%&'*+-.^_`|~) "
                     "separated by commas, got '%.*s'",
                     KG_HEADER_NAME_MAX, (int)(len > 64 ? 64 : len), s);
            return false;
        }
        if (len >= 5 && strncasecmp(s, "kgen-", 5) == 0) {
            snprintf(errstr, errstr_size,
                     "'%.*s': kgen-* headers are the worker's own (the DLQ's kgen-error-reason, "
                     "...) and are not copied",
                     (int)len, s);
            return false;
        }
        if (!names_has(out, s, len)) {
            if (out->n == KG_HEADER_NAMES_MAX) {
                snprintf(errstr, errstr_size, "at most %d header names", KG_HEADER_NAMES_MAX);
                return false;
            }
            memcpy(out->name[out->n], s, len);
            out->name[out->n++][len] = '\0';
        }
        p = end ? end + 1 : p + strlen(p);
    }
    return true;
}
