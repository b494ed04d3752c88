/* kg_status: the one status type of kgen.
 *
 * KG_OK is 0; positive values are soft (retry, back off: like llama_decode
 * returning 1), negative values are hard errors. */
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define KG_NODISCARD __attribute__((warn_unused_result))
#else
#define KG_NODISCARD
#endif

typedef enum kg_status {
    KG_OK = 0,
    KG_AGAIN = 1,   /* nothing to do now; try again later */
    KG_KV_FULL = 2, /* the KV pool has no free block */
    KG_QUEUE_FULL = 3,
    KG_ERR_NOMEM = -1,
    KG_ERR_IO = -2,
    KG_ERR_INVALID = -3,
    KG_ERR_BACKEND = -4,
    KG_ERR_KAFKA = -5,
    KG_ERR_UNSUPPORTED = -6,
} kg_status_t;

/** Name of a status, for logs. Never NULL. @thread any */
const char *kg_status_str(kg_status_t st);
