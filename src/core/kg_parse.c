/* kg_parse: strict numbers from text; see kg_parse.h. */
#include "kg_parse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

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
