#!/usr/bin/env bash
# test_submit_errors: kgen-submit fails cleanly, with a message and exit 1 or 2, when its
# arguments are wrong or librdkafka refuses its configuration (rd_kafka_new failing after the
# conf was built: the conf is still ours and is freed; the AddressSanitizer pass of the tests
# reports any leak). No broker is needed.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup submit-errors
printf '{"request_id":"a","prompt":"x"}\n' >"$T/jobs.jsonl"

expect() { # expect RC REGEX ARGS...: kgen-submit exits RC and prints REGEX on stderr
    local want=$1 re=$2 rc=0
    shift 2
    "$KG_BIN/kgen-submit" "$@" >"$T/out.log" 2>&1 || rc=$?
    ((rc == want)) || kg_fail "kgen-submit $*: exit $rc, expected $want: $(cat "$T/out.log")"
    grep -Eq "$re" "$T/out.log" || kg_fail "kgen-submit $*: no '$re' in: $(cat "$T/out.log")"
}

expect 2 'required' --brokers 127.0.0.1:1
expect 2 'unknown or incomplete option' --brokers 127.0.0.1:1 --no-such-flag
expect 1 'cannot read' --brokers 127.0.0.1:1 --input "$T/missing.jsonl" --output "$T/o.jsonl"
expect 1 'ssl.ca.location' --brokers 127.0.0.1:1 -X security.protocol=ssl \
    -X ssl.ca.location="$T/missing-ca.pem" --input "$T/jobs.jsonl" --output "$T/o.jsonl" --timeout 2
echo "PASS: kgen-submit refuses bad arguments and configurations cleanly"
