/* kg_kafka_conf: librdkafka configuration objects built from kg_config,
 * with our log and error callbacks, for the worker and the tools. */
#pragma once

#include "../config/kg_config.h"

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>

/** A conf with bootstrap.servers and every -X property applied, librdkafka
 * logs routed through kg_log. NULL with errstr set when a property is
 * refused (the message names it; a secret's value is never printed). */
rd_kafka_conf_t *kg_kafka_conf_new(const kg_config_t *cfg, char *errstr, size_t errstr_size);

/** The librdkafka version this process runs with ("2.12.0"): the loaded library's, which
 * can differ from the headers' where another librdkafka.so.1 is found first. */
const char *kg_kafka_version(void);

/** Whether a metadata look-up failed for want of a broker that answered (down, unreachable,
 * or refusing the login) rather than for the topic: then whether the topic exists is unknown,
 * and a warning must not say it is missing. */
bool kg_kafka_err_no_broker(rd_kafka_resp_err_t err);

/** Log a non-fatal librdkafka error event of rk (what an error callback gets): a warning, but
 * a connectivity error (all brokers down, a transport error) only once per client per 30 s,
 * with a count of those held back. kg_kafka_conf_new's conf logs so by default.
 * @thread any (librdkafka's) */
void kg_kafka_log_error(rd_kafka_t *rk, int err, const char *reason);

/** Set one property, or fail with a message naming it. */
int kg_kafka_conf_set(
    rd_kafka_conf_t *conf, const char *key, const char *value, char *errstr, size_t errstr_size);
