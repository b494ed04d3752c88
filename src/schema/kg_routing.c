/* kg_routing: prefix keys; see kg_routing.h. */
#include "kg_routing.h"

#include <stdio.h>
#include <string.h>

#define FNV_OFFSET 14695981039346656037ull
#define FNV_PRIME  1099511628211ull

typedef struct prefix_hash {
    uint64_t h;
    int32_t n_left; /* characters still to take */
} prefix_hash_t;

static void add_bytes(prefix_hash_t *p, const void *data, size_t n) {
    const unsigned char *s = data;
    for (size_t i = 0; i < n; i++) {
        p->h = (p->h ^ s[i]) * FNV_PRIME;
    }
}

/* Add up to n_left characters of UTF-8 text (a character is a lead byte and its
 * continuation bytes; a stray continuation byte counts as one). */
static void add_chars(prefix_hash_t *p, const char *s, size_t len) {
    size_t i = 0;
    while (i < len && p->n_left > 0) {
        size_t j = i + 1;
        while (j < len && ((unsigned char)s[j] & 0xC0) == 0x80 && j - i < 4) {
            j++;
        }
        add_bytes(p, s + i, j - i);
        p->n_left--;
        i = j;
    }
}

void kg_routing_prefix_key(const kg_job_t *job, int32_t n_chars, char out[KG_ROUTING_KEY_SIZE]) {
    prefix_hash_t p = {.h = FNV_OFFSET, .n_left = n_chars > 0 ? n_chars : 1};
    switch (job->prompt_kind) {
    case KG_PROMPT_TEXT:
        add_chars(&p, job->prompt, job->prompt_len);
        break;
    case KG_PROMPT_TOKENS:
        for (int32_t i = 0; i < job->n_prompt_tokens && p.n_left > 0; i++, p.n_left--) {
            uint32_t v = (uint32_t)job->prompt_tokens[i];
            unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8),
                                  (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
            add_bytes(&p, b, 4);
        }
        break;
    case KG_PROMPT_MESSAGES:
        if (job->n_messages > 0 && strcmp(job->messages[0].role, "system") == 0) {
            add_bytes(&p, job->messages[0].content, strlen(job->messages[0].content));
            break;
        }
        for (int32_t i = 0; i < job->n_messages && p.n_left > 0; i++) {
            add_chars(&p, job->messages[i].role, strlen(job->messages[i].role));
            add_chars(&p, "\n", 1);
            add_chars(&p, job->messages[i].content, strlen(job->messages[i].content));
            add_chars(&p, "\n", 1);
        }
        break;
    }
    snprintf(out, KG_ROUTING_KEY_SIZE, "pfx-%016llx", (unsigned long long)p.h);
}
