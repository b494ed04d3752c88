/* kg_status: names of the status codes. */
#include "kg_status.h"

const char *kg_status_str(kg_status_t st) {
    switch (st) {
    case KG_OK:
        return "ok";
    case KG_AGAIN:
        return "again";
    case KG_KV_FULL:
        return "kv cache full";
    case KG_QUEUE_FULL:
        return "queue full";
    case KG_ERR_NOMEM:
        return "out of memory";
    case KG_ERR_IO:
        return "i/o error";
    case KG_ERR_INVALID:
        return "invalid argument";
    case KG_ERR_BACKEND:
        return "backend error";
    case KG_ERR_KAFKA:
        return "kafka error";
    case KG_ERR_UNSUPPORTED:
        return "unsupported";
    }
    return "unknown status";
}
