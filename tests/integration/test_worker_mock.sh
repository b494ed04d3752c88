#!/usr/bin/env bash
# test_worker_mock: `kgen-worker --demo 24` runs the whole worker on librdkafka's in-process mock
# cluster (no JVM): it exits 0 and prints exactly one terminal event (done or error) for each of
# its 24 sample jobs, token events in index order whose texts join to the done text: 23 done
# events (the chat jobs render with the demo model's ChatML template) and the one job that is
# invalid on purpose (max_tokens -1) with an invalid_job error event. Fault injection on the mock cluster is tests/unit/check_worker_mock.c.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
kg_setup worker-mock

kg_bg demo env TMPDIR="$T" "$KG_BIN/kgen-worker" --demo 24 --http-port 0 --threads 2
pid=$(kg_pid demo)
kg_wait_exit "$pid" 120
((KG_RC == 0)) || kg_fail "kgen-worker --demo 24 exited $KG_RC"
# stdout (events) and stderr (log) share demo.log: events are the lines starting with {
grep '^{' "$T/demo.log" >"$T/events.jsonl" || true
python3 - "$T/events.jsonl" <<'PY'
import collections, json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
term = [e for e in ev if e["type"] in ("done", "error")]
per = collections.Counter(e["request_id"] for e in term)
assert set(per) == {f"demo-{i}" for i in range(24)}, sorted(per)
assert all(n == 1 for n in per.values()), [k for k, n in per.items() if n > 1]
tokens = collections.defaultdict(list)
for e in ev:
    if e["type"] == "token":
        tokens[e["request_id"]].append(e)
for rid, toks in tokens.items():
    assert [t["index"] for t in toks] == list(range(len(toks))), rid
n_joined = 0
for e in term:
    if e["type"] == "done" and tokens[e["request_id"]]:
        assert "".join(t["text"] for t in tokens[e["request_id"]]) == e["text"], e["request_id"]
        n_joined += 1
codes = collections.Counter(e["code"] for e in term if e["type"] == "error")
assert codes == {"invalid_job": 1}, codes
assert [e["request_id"] for e in term if e["type"] == "error"] == ["demo-11"]
done = sum(1 for e in term if e["type"] == "done")
assert done == 23, done
assert {"demo-10", "demo-22"} <= {e["request_id"] for e in term if e["type"] == "done"}
print(f"demo: {len(term)} terminal events ({done} done, {dict(codes)}), "
      f"{len(ev) - len(term)} token events, {n_joined} streamed texts joined")
PY
echo "PASS: kgen-worker --demo 24 on the mock cluster in $(kg_elapsed) s"
