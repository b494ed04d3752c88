/* kg_auth: the streak of authentication failures behind --auth-timeout (kg_auth.h says why). */
#include "kg_auth.h"

#include <stdio.h>

void kg_auth_start(kg_auth_t *a, int64_t now_ms) {
    *a = (kg_auth_t){.start_ms = now_ms > 0 ? now_ms : 1};
}

void kg_auth_failed(kg_auth_t *a, int64_t now_ms, const char *reason) {
    if (a->first_ms == 0 || now_ms - a->last_ms > KG_AUTH_QUIET_MS) {
        int64_t first = a->start_ms && a->start_ms < now_ms ? a->start_ms : now_ms;
        a->first_ms = first > 0 ? first : 1;
        a->n_failures = 0;
    }
    a->last_ms = now_ms;
    a->n_failures++;
    snprintf(a->reason, sizeof(a->reason), "%s", reason ? reason : "");
    a->denied = false;
}

void kg_auth_denied(kg_auth_t *a, int64_t now_ms, const char *reason) {
    kg_auth_failed(a, now_ms, reason);
    a->denied = true;
}

void kg_auth_ok(kg_auth_t *a) {
    a->start_ms = 0;
    a->first_ms = 0;
    a->n_failures = 0;
}

int64_t kg_auth_failing_ms(const kg_auth_t *a, int64_t now_ms) {
    if (a->first_ms == 0 || now_ms - a->last_ms > KG_AUTH_QUIET_MS) {
        return 0;
    }
    return now_ms - a->first_ms;
}
