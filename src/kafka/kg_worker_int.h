/* kg_worker_int.h: what the worker's files share (not for use outside them).
 *
 * The worker is one struct and one thread (the kafka thread; see
 * kg_worker.h for the design), split by what each part does:
 *   kg_worker.c             lifecycle: new, the poll loop and the drain, free;
 *                           the fatal stop;
 *   kg_worker_intake.c      a message off the jobs topic: decode, start, and
 *                           the poison holds (kg_journal) before that;
 *   kg_worker_jobs.c        the job records, the lanes' queues to the engine,
 *                           its completions and the users' cancels;
 *   kg_worker_produce.c     what goes out: events, dead-letter copies,
 *                           refused deliveries, delivery reports, stored
 *                           offsets, exactly-once transactions, the producer;
 *   kg_worker_partitions.c  the consumer: assignment and rebalance,
 *                           backpressure (pause/resume), lag.
 * Each sub-struct of struct kg_worker is owned by one of these files: its
 * fields are written there (and filled in by kg_worker_new, cleared by
 * kg_worker_free); the other files read them and call the objects they hold
 * (the offsets tracker, say, is the partitions', but intake tracks a
 * message's offset in it and produce marks it done). */
#pragma once

#include "../pipeline/kg_intake.h"
#include "../pipeline/kg_jobrun.h"
#include "../pipeline/kg_runner.h"
#include "../pipeline/kg_served.h"
#include "../pipeline/kg_stack.h"
#include "../schema/kg_codec.h"
#include "kg_assignment.h"
#include "kg_auth.h"
#include "kg_cancel.h"
#include "kg_journal.h"
#include "kg_lanes.h"
#include "kg_offsets.h"
#include "kg_trace.h"
#include "kg_txn.h"
#include "kg_worker.h"

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define MAX_PARTITIONS 1024 /* per jobs topic, for the lag gauges */
/* Inside the worker a job's "partition" is a dense index over the lanes'
 * topics (kg_lanes): lane * LANE_STRIDE + the partition on its topic, so one
 * number keys the offsets tracker, the records and the acks; with one lane
 * it is the partition itself. The real topic and partition are taken back
 * at the edges: events, the journal, DLQ headers, logs, Kafka calls. */
#define LANE_STRIDE (KG_OFFSETS_MAX_PARTITIONS / KG_LANES_MAX)
#define POLL_BATCH  64

// ---- what the files pass around: records, acks, messages ----

typedef enum rec_state {
    REC_PENDING,   /* prepared, waiting for room in the engine */
    REC_SUBMITTED, /* in the engine */
    REC_REVOKED,   /* partition revoked or shutdown: finish quietly */
} rec_state_t;

typedef struct job_rec {
    uint64_t id;
    kg_jobrun_t run; /* the job from intake to its terminal event (kg_jobrun) */
    rec_state_t state;
    int64_t cancel_step;   /* kg_runner_steps when a user's cancel was applied */
    kg_trace_t trace;      /* the headers its events carry, its trace_id (kg_trace) */
    struct job_rec *hnext; /* id hash chain */
    struct job_rec *qnext; /* pending FIFO */
} job_rec_t;

/* What a message answers, for its delivery report. A message without one
 * (a token event, a dead-letter copy of an event) answers nothing. */
typedef enum ack_kind {
    ACK_RESULT, /* a job's terminal event (done or error) */
    ACK_ANSWER, /* the error event that replaces a terminal event the broker refused */
    ACK_DLQ,    /* an unparseable job's dead-letter copy: its only answer */
} ack_kind_t;

/* What a delivery report needs: the job's offset to mark done, and what to
 * log and count once the broker has the answer. */
typedef struct ack {
    int32_t partition;
    int64_t offset;
    ack_kind_t kind;
    bool is_error;             /* ACK_RESULT */
    kg_finish_reason_t reason; /* ACK_RESULT, done */
    kg_error_code_t code;      /* ACK_RESULT, error */
    int32_t n_gen;             /* ACK_RESULT, done: tokens generated */
    double total_ms;           /* ACK_RESULT, done */
    char log_fields[48];       /* the job's " trace_id=..." for the log line, or "" */
} ack_t;

/* A job message off the jobs topic: borrowed from the consumer's message,
 * or from a held copy. */
typedef struct job_msg {
    int32_t partition;
    int64_t offset;
    const void *key;
    size_t key_len;
    const void *payload;
    size_t len;
    int64_t taken_us;        /* when it was taken off Kafka (kg_clock_us): its timings start here */
    kg_job_format_t format;  /* its kgen-format header (AUTO when it has none) */
    const kg_trace_t *trace; /* its headers to copy onto its events (kg_trace) */
} job_msg_t;

/* A message that waits before it may start (kg_journal): for the snapshot
 * that records it as running to be acknowledged; a suspect (a job that was
 * running when a worker failed) for its group's turn (kg_suspects.h); any
 * job while a suspect runs solo. */
typedef struct held_msg {
    job_msg_t m;      /* key and payload are owned copies; m.trace is &trace */
    kg_trace_t trace; /* owned copy */
    int strikes;      /* consecutive worker failures it was present in */
    int level;        /* its group (kg_suspects.h) */
    uint64_t ticket;  /* its journal snapshot; 0 while it waits for its turn */
    struct held_msg *next;
} held_msg_t;

/* A suspect of the group that runs (kg_suspects.h). */
typedef struct round_slot {
    int32_t partition; /* dense */
    int64_t offset;
} round_slot_t;

/* A dead-letter copy: what goes to the DLQ and why (headers kgen-*). */
typedef struct dlq_copy {
    const char *key;
    size_t key_len;
    const void *payload;
    size_t len;
    const char *payload_kind; /* kgen-payload: "job" or "event" */
    const char *reason;       /* kgen-error-reason */
    const char *message;      /* kgen-error-message */
    int32_t partition;        /* of the job on the jobs topic */
    int64_t offset;
    const rd_kafka_headers_t *trace_hdrs; /* the job's headers to copy (kg_trace), or NULL */
} dlq_copy_t;

// ---- the worker ----

struct kg_worker {
    /* set by kg_worker_new, then read-only */
    const kg_config_t *cfg;
    const kg_model_t *model;
    char worker_id[128];
    /* random at start: with a run's number (a job record's id) it makes the attempt id every
     * event carries, which tells two runs of one job apart even on one worker (kg_events.h) */
    uint64_t incarnation;
    kg_lanes_t lanes;      /* the jobs topics and their weights */
    int32_t queue_depth;   /* --max-queue-depth, or what 0 chose (kg_worker_new) */
    int32_t max_inflight;  /* max_batch_size + queue_depth */
    kg_stack_t *stack;     /* backend, engine, grammar cache, runner (kg_stack) */
    kg_runner_t *runner;   /* the stack's: the engine thread */
    kg_served_t served;    /* the model's names (intake.limits.served points into it) */
    kg_worker_metrics_t m; /* atomics, counted where things happen */

    /* kg_worker.c: running, draining, stopping */
    struct {
        _Atomic int stop_requested; /* set by a signal handler or another thread (the demo) */
        bool draining;
        int64_t drain_deadline_us;
        int fatal;        /* non-zero: stop at once, exit non-zero */
        bool fatal_kafka; /* the fatal error was Kafka's, not possibly a job's */
        kg_auth_t auth;   /* failing logins, for --auth-timeout */
    } life;

    /* kg_worker_intake.c: decoding and starting jobs, the poison holds */
    struct {
        kg_intake_limits_t limits;
        kg_codec_opts_t codec_opts;
        kg_trace_names_t trace_names;        /* the headers copied from a job onto its events */
        const char *crash_request_id;        /* TEST-ONLY fault injection; NULL normally */
        kg_journal_t *journal[KG_LANES_MAX]; /* the poison-job journal per lane; NULL when off */
        held_msg_t *held_head, *held_tail;   /* waiting for their snapshot's ack */
        held_msg_t *suspects_head, *suspects_tail; /* suspects waiting for their group's turn */
        held_msg_t *deferred_head, *deferred_tail; /* jobs taken while a suspect runs solo */
        int32_t n_held;                            /* in the three lists */
        round_slot_t *round;                       /* (n_round) the group that runs */
        int32_t n_round, cap_round;
        int round_level;         /* its level; 1 is open to late level-1 suspects */
        bool solo;               /* a suspect runs (or waits to run) alone: jobs are deferred */
        int64_t last_suspect_us; /* when the newest suspect was held */
    } intake;

    /* kg_worker_jobs.c: the records of the jobs taken, their way to the engine */
    struct {
        uint64_t next_id;
        job_rec_t **table; /* (table_size) id -> record */
        size_t table_size;
        struct {
            job_rec_t *head, *tail; /* priority, then arrival */
        } q[KG_LANES_MAX];          /* prepared jobs waiting for the engine, per lane */
        int32_t n_inflight;  /* records alive: pending + submitted + revoked awaiting finish */
        int32_t n_pending;   /* records waiting in the lane queues */
        int32_t n_in_engine; /* records submitted to the engine and not finished there */
        int32_t n_in_engine_lane[KG_LANES_MAX]; /* the same, per lane (kg_lanes_has_room) */
        int32_t n_engine_recs; /* engine request records: one per choice (kg_engine_submit) */
        int32_t n_engine_seqs; /* choices of the jobs in the engine */
        kg_cancel_t *cancel;   /* the cancel topic's reader; NULL with none */
    } jobs;

    /* kg_worker_produce.c: the producer and what it sends */
    struct {
        rd_kafka_t *producer;
        kg_txn_t *txn; /* --exactly-once: answers and offsets in transactions (producer: tokens) */
        char dlq_topic[KG_LANES_MAX][512]; /* per lane */
        size_t max_event_bytes;            /* value bytes one event may take (kg_events' budget) */
        size_t max_dlq_bytes;              /* payload bytes of a dead-letter copy (headers apart) */
        size_t max_trace_bytes;            /* bytes of a job's headers its messages carry */
        int64_t delivered_us;              /* the last delivery a broker acknowledged */
    } out;

    /* kg_worker_partitions.c: the consumer, its partitions and their offsets */
    struct {
        rd_kafka_t *consumer;
        kg_offsets_t *offsets;
        rd_kafka_topic_partition_list_t *assigned; /* owned copy of what is held (kg_assignment) */
        kg_group_protocol_t protocol;              /* the group protocol the consumer runs */
        bool may_fall_back; /* --group-protocol auto: a refusal switches to classic */
        bool fall_back;     /* the broker refused the consumer protocol: switch (kg_worker.c) */
        bool ever_assigned; /* a rebalance callback has assigned partitions */
        bool warned_unassigned;
        int64_t started_us; /* the consumer's start, for the warning without partitions */
        bool lane_paused[KG_LANES_MAX]; /* backpressure, lowest lanes first */
        _Atomic int64_t lag[KG_LANES_MAX][MAX_PARTITIONS];
        _Atomic int32_t lag_valid[KG_LANES_MAX][MAX_PARTITIONS];
        int64_t last_lag_us;
        /* the coordinator watchdog (kg_worker_check_coordinator): since when offset commits
         * fail for want of a group coordinator (0: the last one went through), and how long
         * that may last while the brokers take this worker's events */
        int64_t coord_lost_us;
        int64_t coord_stuck_us;
    } parts;
};

// ---- dense partitions ----

static inline int lane_of(int32_t dense) {
    return dense / LANE_STRIDE;
}

/* The partition on its topic of a dense index. */
static inline int32_t part_of(int32_t dense) {
    return dense % LANE_STRIDE;
}

static inline int32_t dense_of(int lane, int32_t partition) {
    return lane * LANE_STRIDE + partition;
}

static inline const char *topic_of(const kg_worker_t *w, int32_t dense) {
    return w->lanes.lane[lane_of(dense)].topic;
}

/* Whether the dense `partition` is in `parts` (topics and partitions; NULL: all). */
static inline bool
in_parts(const kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts, int32_t partition) {
    for (int k = 0; parts && k < parts->cnt; k++) {
        if (parts->elems[k].partition == part_of(partition) &&
            strcmp(parts->elems[k].topic, topic_of(w, partition)) == 0) {
            return true;
        }
    }
    return parts == NULL;
}

// ---- kg_worker.c ----

/** Stop at once and exit non-zero, storing no unfinished offsets. */
void kg_worker_fatal(kg_worker_t *w, const char *what);
/** The same for a fatal error of the broker or a topic: no job can have
 * caused it, so the journal hands the partitions over as clean. */
void kg_worker_fatal_kafka(kg_worker_t *w, const char *what);
/** librdkafka's error_cb, for the consumer and the producer. */
void kg_worker_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque);

// ---- kg_worker_intake.c ----

/** A message off the jobs topic (borrowed: destroyed by the caller). */
void kg_worker_on_message(kg_worker_t *w, rd_kafka_message_t *rkm);
/** Start the next group of suspects when none runs (kg_suspects.h). */
void kg_worker_start_next_suspect(kg_worker_t *w);
/** Start every held job whose snapshot the broker has acknowledged. */
void kg_worker_release_held(kg_worker_t *w);
/** Give back (uncommitted) the held messages of `parts` (NULL: all). */
void kg_worker_drop_held(kg_worker_t *w, const rd_kafka_topic_partition_list_t *parts);
/** The job was answered: off the journal's record. */
void kg_worker_job_answered(kg_worker_t *w, int32_t partition, int64_t offset);
/** The job was given back unfinished (revoke, drain): it keeps its strikes. */
void kg_worker_job_given_back(kg_worker_t *w, int32_t partition, int64_t offset);

// ---- kg_worker_jobs.c ----

void kg_worker_rec_insert(kg_worker_t *w, job_rec_t *r);
void kg_worker_rec_free(kg_worker_t *w, job_rec_t *r);
/** Queue a prepared record in its lane (`front`: a job the engine handed back). */
void kg_worker_pending_push(kg_worker_t *w, job_rec_t *r, bool front);
/** Take a pending record off its lane's queue. */
void kg_worker_pending_unlink(kg_worker_t *w, job_rec_t *r);
/** Hand the runner every pending record it may take now. */
void kg_worker_submit_pending(kg_worker_t *w);
/** Take the runner's events (completions), waiting up to timeout_ms. */
void kg_worker_drain_engine_events(kg_worker_t *w, int timeout_ms);
/** Apply the cancels that arrived on the cancel topic. */
void kg_worker_poll_cancels(kg_worker_t *w);

// ---- kg_worker_produce.c ----

/** Make the producer (and the transactional one) and fit the event budget
 * to the topics (out.max_event_bytes, out.max_dlq_bytes). */
KG_NODISCARD kg_status_t kg_worker_size_messages(kg_worker_t *w, char *errstr, size_t errstr_size);
/** An error event for a job that never reached the engine; it carries the
 * job's headers (`trace`, may be NULL). */
void kg_worker_produce_error(kg_worker_t *w,
                             const char *request_id,
                             int32_t partition,
                             int64_t offset,
                             kg_error_code_t code,
                             const char *message,
                             const char *metadata_json,
                             const kg_trace_t *trace);
/** The terminal event of a finished job (or of one the engine refused). */
void kg_worker_produce_terminal(kg_worker_t *w, job_rec_t *r, kg_status_t refused, int64_t now_us);
/** The token events of one step of a streaming job. */
void kg_worker_emit_token_events(kg_worker_t *w, job_rec_t *r, const kg_jobrun_step_t *js);

/** Copy a message to the dead-letter topic; `ack` (may be NULL) is taken. */
void kg_worker_dead_letter(kg_worker_t *w, const dlq_copy_t *c, ack_t *ack);
/** An unparseable job: its DLQ copy is its answer. */
void kg_worker_dead_letter_job(kg_worker_t *w, const job_msg_t *m, const kg_codec_error_t *err);
/** Store the offsets that advanced (or hand them to the transaction). */
void kg_worker_store_offsets(kg_worker_t *w);
/** Commit the transaction when due (or now, with `force`); true without one. */
bool kg_worker_commit_txn(kg_worker_t *w, bool force);

// ---- kg_worker_partitions.c ----

/** The consumer, configured for the worker and subscribed to the jobs topics
 * (parts.consumer; its group protocol in parts.protocol). */
KG_NODISCARD kg_status_t kg_worker_start_consumer(kg_worker_t *w, char *errstr, size_t errstr_size);
/** The broker refused the consumer group protocol (parts.fall_back, set by the error
 * callback under --group-protocol auto): a new consumer on the classic one. */
void kg_worker_fall_back_to_classic(kg_worker_t *w);
/** Warn once when the consumer protocol has assigned nothing for 30 s. */
void kg_worker_check_group(kg_worker_t *w, int64_t now_us);

/** A jobs consumer that reaches no group coordinator for parts.coord_stuck_us while the brokers
 * acknowledge this worker's events ends the worker (kg_worker_partitions.c says why). */
void kg_worker_check_coordinator(kg_worker_t *w, int64_t now_us);
/** Pause at the in-flight cap and resume at 3/4 of it. */
void kg_worker_check_backpressure(kg_worker_t *w);
/** Cancel quietly every job of `parts` (NULL: all), or only the unstarted. */
void kg_worker_abandon_jobs(kg_worker_t *w,
                            const rd_kafka_topic_partition_list_t *parts,
                            bool unstarted_only);
/** Refresh the lag gauges (at most once a second). */
void kg_worker_update_lag(kg_worker_t *w);
