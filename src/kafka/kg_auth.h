/* kg_auth: how long the worker has been unable to log in to Kafka, for --auth-timeout.
 *
 * librdkafka retries a failed SASL login for ever, reporting RD_KAFKA_RESP_ERR__AUTHENTICATION
 * to the error callback each time it stops suppressing the repeat (the first two at once, then at
 * most one per broker connection every 30 s). A worker with a wrong password would log that for
 * ever and never take a job; an orchestrator only sees a crash loop it can alert on. So a streak
 * of failures starts at the first one, ends at a sign that the worker is logged in (an
 * assignment, a message) or when no failure has come for KG_AUTH_QUIET_MS (a broker that
 * refused one login while it restarted), and the worker exits once a streak lasts
 * --auth-timeout seconds. A worker that has never been logged in counts from its start: the
 * callbacks only run in the kafka thread's polls, which begin after the start-up look-ups (up
 * to 15 s when no broker answers). Called on the kafka thread only. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* longer than librdkafka's 30 s suppression of a repeated error plus its 10 s reconnect backoff:
 * failures that go on always come again within it */
#define KG_AUTH_QUIET_MS 45000

typedef struct {
    int64_t start_ms; /* the worker's start while it has never been logged in; 0 after */
    int64_t first_ms; /* the streak's first failure; 0 = no streak */
    int64_t last_ms;  /* its latest */
    int n_failures;
    char reason[384]; /* librdkafka's words for the latest (no secret: it never prints one) */
    bool denied;      /* the latest was an authorization error (an ACL missing), not a login */
} kg_auth_t;

/** The worker starts at now_ms, not logged in yet. */
void kg_auth_start(kg_auth_t *a, int64_t now_ms);

/** An authentication failure at now_ms (a monotonic clock in ms). */
void kg_auth_failed(kg_auth_t *a, int64_t now_ms, const char *reason);

/** An authorization failure at now_ms: logged in, but an ACL the worker cannot run without
 * (Read on its group or jobs topic) is missing. It counts as a login failure does, so that
 * an ACL added within --auth-timeout lets the worker go on, and one never added ends it. */
void kg_auth_denied(kg_auth_t *a, int64_t now_ms, const char *reason);

/** A sign that the worker is logged in: the streak ends. */
void kg_auth_ok(kg_auth_t *a);

/** How long the current streak has lasted at now_ms; 0 when there is none. */
int64_t kg_auth_failing_ms(const kg_auth_t *a, int64_t now_ms);
