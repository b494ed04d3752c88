/* kg_codec_writer: how kgen writes JSON values, for the job encoder
 * (kg_codec_job_encode.c) and the event encoder (kg_codec_event_encode.c):
 * any bytes as a string (invalid UTF-8 as U+FFFD), floats in their
 * shortest form, logprobs without infinities, and the producer's metadata
 * text spliced in verbatim. kg_codec_text_prefix (kg_codec_event.h) lives
 * here because it must measure a string exactly as it is written. A leaf:
 * it calls nothing else of src/schema/. */
#include "../core/kg_log.h"
#include "kg_codec_event.h"
#include "kg_codec_int.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Our reals have at most 9 (floats) or ~13 (rounded timings) significant
 * digits; 15 prints them short and exact. jansson's default (17) would
 * print 0.7 as 0.69999999999999996. */
#define KG_DUMP_FLAGS      (JSON_COMPACT | JSON_REAL_PRECISION(15))
#define KG_LOGPROB_NEG_INF (-9999.0)

// ---- writing JSON ----

/* Length of the well-formed UTF-8 sequence at s, or 0 with *bad set to
 * the length of its maximal ill-formed prefix (Unicode's "maximal subpart",
 * which becomes one U+FFFD). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0];
    unsigned lo = 0x80;
    unsigned hi = 0xBF;
    size_t need;
    if (c < 0x80) {
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* U+FFFD in UTF-8: three bytes, no NUL (the copy below is counted, not a C string) */
static const char replacement_char[3] = "\xEF\xBF\xBD";

/* A copy of s with every ill-formed sequence replaced by U+FFFD. */
static char *utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    char *out = malloc(len * 3 + 1); // each bad byte may become 3 bytes
    size_t o = 0;
    if (!out) {
        return NULL;
    }
    for (size_t i = 0; i < len;) {
        size_t bad = 0;
        size_t k = utf8_seq((const unsigned char *)s + i, len - i, &bad);
        if (k > 0) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, replacement_char, sizeof(replacement_char));
            o += sizeof(replacement_char);
            i += bad;
        }
    }
    *out_len = o;
    return out;
}

size_t kg_codec_text_prefix(const char *s, size_t len, size_t room, size_t *text_bytes) {
    size_t used = 0, decoded = 0, i = 0;
    while (i < len) {
        size_t bad = 0;
        size_t k = utf8_seq((const unsigned char *)s + i, len - i, &bad);
        size_t written, read = k, out = k;
        if (k == 0) { /* one U+FFFD for the maximal ill-formed subpart */
            written = out = 3;
            read = bad;
        } else if (k == 1) { /* jansson: \" \\ \b \f \n \r \t, \u00XX for other controls */
            unsigned char c = (unsigned char)s[i];
            bool short_escape = c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' ||
                                c == '\r' || c == '\t';
            written = short_escape ? 2 : c < 0x20 ? 6 : 1;
        } else {
            written = k;
        }
        if (used + written > room) {
            break;
        }
        used += written;
        decoded += out;
        i += read;
    }
    if (text_bytes) {
        *text_bytes = decoded;
    }
    return i;
}

/* A JSON string of any bytes: NULL is "", invalid UTF-8 becomes U+FFFD.
 * NULL only when memory ran out. */
json_t *kg_codec_text_json(const char *s, size_t len) {
    if (!s) {
        return json_string("");
    }
    json_t *v = json_stringn(s, len);
    if (v) {
        return v;
    }
    size_t clean_len;
    char *clean = utf8_sanitize(s, len, &clean_len);
    if (clean) {
        v = json_stringn(clean, clean_len);
        free(clean);
    }
    return v;
}

json_t *kg_codec_cstr_json(const char *s) {
    return kg_codec_text_json(s, s ? strlen(s) : 0);
}

/* The shortest decimal that reads back as the same float, as a double
 * (0.7f -> 0.7, not 0.699999988079071). */
static double float_shortest(float f) {
    char tmp[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(tmp, sizeof(tmp), "%.*g", p, (double)f);
        double d = strtod(tmp, NULL);
        if ((float)d == f) {
            return d;
        }
    }
    return (double)f;
}

json_t *kg_codec_float_json(float f) {
    return json_real(float_shortest(f));
}

json_t *kg_codec_logprob_json(float lp) {
    if (isnan(lp) || isinf(lp)) {
        return json_real(KG_LOGPROB_NEG_INF);
    }
    return json_real(
        float_shortest(lp < (float)KG_LOGPROB_NEG_INF ? (float)KG_LOGPROB_NEG_INF : lp));
}

/* A duration or rate rounded to 3 decimals (microseconds for ms); negative
 * values (a clock step) and non-finite ones are written as 0. */
json_t *kg_codec_nonneg_json(double x) {
    if (!(x > 0) || isinf(x)) {
        return json_real(0.0);
    }
    return json_real(round(x * 1000.0) / 1000.0);
}

/* Set a fresh value; a NULL value or a failed set marks the build failed. */
void kg_codec_put(json_t *obj, const char *key, json_t *v, bool *ok) {
    if (!v || json_object_set_new(obj, key, v) != 0) {
        *ok = false;
    }
}

void kg_codec_append(json_t *arr, json_t *v, bool *ok) {
    if (!v || json_array_append_new(arr, v) != 0) {
        *ok = false;
    }
}

/* Dump `obj` and splice in `"metadata": <metadata_json>` when given and it
 * is a JSON object; the text goes in verbatim, so numbers keep their digits. */
char *kg_codec_dump_with_metadata(json_t *obj, const char *metadata_json, size_t *len) {
    char *text = json_dumps(obj, KG_DUMP_FLAGS);
    json_t *check = NULL;
    if (!text || !metadata_json) {
        goto out;
    }
    check = json_loads(metadata_json, KG_LOAD_FLAGS, NULL);
    if (!json_is_object(check)) {
        KG_LOG_WARN("codec", "metadata is not a JSON object; left out of the event");
        goto out;
    }
    size_t n = strlen(text);
    size_t m = strlen(metadata_json);
    char *joined = realloc(text, n + m + sizeof(",\"metadata\":"));
    if (!joined) {
        free(text);
        text = NULL;
        goto out;
    }
    text = joined;
    // text ends with the object's '}' (it always holds other members): replace that '}' with
    // the new member and the closing '}'; 1 + m + sizeof(...) bytes are left from text + n - 1.
    snprintf(text + n - 1, 1 + m + sizeof(",\"metadata\":"), ",\"metadata\":%s}", metadata_json);
out:
    json_decref(check);
    if (text && len) {
        *len = strlen(text);
    }
    return text;
}
