#!/usr/bin/env bash
# test_worker_poison_exactly_once: test_worker_poison.sh with --exactly-once: the poison-job journal
# and the transactions together. The journal writes outside the transactions (a crash must be on
# record even when the transaction that would have answered the job never commits); the poisoned
# job's internal error and DLQ copy commit in a transaction with its offset; the aborted
# transactions of the crashed workers hide their answers, and a read_committed reader sees one
# terminal event per job. Uses the real broker (transactions).
set -euo pipefail
# kg_broker_start: the real-broker label comes from test_worker_poison.sh, which this runs
KG_POISON_NAME=worker-poison-eos KG_POISON_WORKER_ARGS=--exactly-once \
    exec bash "$(dirname "$0")/test_worker_poison.sh"
