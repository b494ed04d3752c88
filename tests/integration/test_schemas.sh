#!/usr/bin/env bash
# test_schemas: the JSON Schemas in schemas/ are valid 2020-12 schemas, every
# example under schemas/examples/valid/ passes its schema (job-*.json against
# job.schema.json, event-*.json against event.schema.json), and every invalid
# job example is rejected by the schema exactly where the manifest says the
# schema can express the rule. The codec side of the same examples is
# unit_codec. Needs python3-jsonschema (installed by the project's test
# setup); missing, the test fails rather than skips, since the schemas are the
# contract producers validate against.
set -euo pipefail

src="${KG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"

if ! python3 -c 'import jsonschema' 2>/dev/null; then
    echo "test_schemas: python3-jsonschema is not installed (Debian: apt-get install python3-jsonschema)" >&2
    exit 1
fi

python3 - "$src/schemas" <<'EOF'
import importlib.metadata
import json
import os
import sys

import jsonschema
from jsonschema import Draft202012Validator

root = sys.argv[1]
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL", msg)


def load_schema(name):
    with open(os.path.join(root, name), encoding="utf-8") as f:
        schema = json.load(f)
    Draft202012Validator.check_schema(schema)
    if schema.get("$schema") != "https://json-schema.org/draft/2020-12/schema":
        fail(f"{name}: $schema is not 2020-12")
    if not schema.get("$id", "").startswith("https://kgen.dev/schemas/"):
        fail(f"{name}: $id is not under https://kgen.dev/schemas/")
    return Draft202012Validator(schema)


def load_json(path):
    # Strict UTF-8, as the worker reads it; Python's json takes the last of
    # duplicate keys, which is why those cases are "accepts" below.
    with open(path, encoding="utf-8", errors="strict") as f:
        return json.load(f)


job = load_schema("job.schema.json")
event = load_schema("event.schema.json")
cancel = load_schema("cancel.schema.json")

valid_dir = os.path.join(root, "examples", "valid")
n_valid = {"job": 0, "event": 0, "cancel": 0}
schemas = {"job": job, "event": event, "cancel": cancel}
for name in sorted(os.listdir(valid_dir)):
    kind = name.split("-", 1)[0]
    if kind not in n_valid or not name.endswith(".json"):
        fail(f"valid/{name}: not named job-*.json, event-*.json or cancel-*.json")
        continue
    errors = list(schemas[kind].iter_errors(load_json(os.path.join(valid_dir, name))))
    for e in errors:
        fail(f"valid/{name}: {e.message} at {list(e.absolute_path)}")
    n_valid[kind] += 1
if n_valid["job"] < 8:
    fail(f"only {n_valid['job']} valid job examples (want at least 8)")
for t in ("token", "done", "error"):
    if not any(n.startswith(f"event-{t}") for n in os.listdir(valid_dir)):
        fail(f"no valid event-{t}* example")

invalid_dir = os.path.join(root, "examples", "invalid")
listed = set()
counts = {"rejects": 0, "accepts": 0, "n/a": 0}
with open(os.path.join(invalid_dir, "manifest.tsv"), encoding="utf-8") as f:
    for line in f:
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 5 or cols[2] not in ("dlq", "error") or cols[3] not in counts:
            fail(f"manifest: bad line {line!r}")
            continue
        name, code, kind, schema_says, _ = cols
        if kind == "error" and code != "invalid_job":
            fail(f"manifest: {name}: error rows must expect invalid_job")
        listed.add(name)
        counts[schema_says] += 1
        path = os.path.join(invalid_dir, name)
        try:
            doc = load_json(path)
        except (ValueError, UnicodeDecodeError):
            if schema_says != "n/a":
                fail(f"invalid/{name}: not JSON but the manifest says {schema_says}")
            continue
        if schema_says == "n/a":
            fail(f"invalid/{name}: parses as JSON but the manifest says n/a")
            continue
        ok = job.is_valid(doc)
        if schema_says == "rejects" and ok:
            fail(f"invalid/{name}: the job schema accepts it")
        if schema_says == "accepts" and not ok:
            fail(f"invalid/{name}: the schema rejects it; mark it 'rejects' in the manifest")

on_disk = {n for n in os.listdir(invalid_dir) if n != "manifest.tsv"}
for name in sorted(on_disk - listed):
    fail(f"invalid/{name}: not in manifest.tsv")
for name in sorted(listed - on_disk):
    fail(f"manifest.tsv: {name} does not exist")

for doc in ({}, {"request_id": ""}, {"request_id": "a b"}, {"request_id": "x", "schema_version": 2}):
    if cancel.is_valid(doc):
        fail(f"cancel schema accepts {doc}")
print(f"valid: {n_valid['job']} jobs, {n_valid['event']} events, {n_valid['cancel']} cancels; invalid: {len(listed)} "
      f"(schema rejects {counts['rejects']}, cannot express {counts['accepts']}, not JSON {counts['n/a']}); "
      f"jsonschema {importlib.metadata.version('jsonschema')}")
sys.exit(1 if failures else 0)
EOF
