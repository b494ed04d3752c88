#!/usr/bin/env bash
# test_k8s_manifests: docker/k8s/ as far as a machine without a cluster can check it. Every file
# parses as YAML; the Deployment and the KEDA ScaledObject have the fields Kubernetes and KEDA
# require; the Deployment runs the compose file's worker image with every environment variable
# the compose file gives its workers, each one a real kgen-worker setting (`--help-markdown`);
# the ScaledObject scales that Deployment on that group's lag on that topic, no further than the
# compose file's partitions, and its Prometheus query names a metric the worker serves.
set -euo pipefail
bin="${KG_BIN_DIR:?}"
src="${KG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
python3 -c 'import yaml' 2>/dev/null || {
    echo "SKIP: python3-yaml not installed"
    exit 77
}
tmp=$(mktemp -d "${KG_TEST_TMP:-/tmp}/k8s.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$bin/kgen-worker" --help-markdown >"$tmp/options.md"
python3 - "$src" "$tmp/options.md" <<'PY'
import glob, os, re, sys
import yaml

src, options_md = sys.argv[1], sys.argv[2]
errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)

docs = {}
for path in sorted(glob.glob(os.path.join(src, "docker/k8s/*.yaml"))):
    with open(path) as f:
        for d in yaml.safe_load_all(f):
            if d is None:
                continue
            for key in ("apiVersion", "kind", "metadata"):
                check(key in d, f"{os.path.basename(path)}: no {key}")
            check(bool(d.get("metadata", {}).get("name")), f"{os.path.basename(path)}: no metadata.name")
            docs[d["kind"]] = d
check("Deployment" in docs and "ScaledObject" in docs, f"kinds found: {sorted(docs)}")
env_names = set(re.findall(r"\| `(KGEN_[A-Z0-9_]+)` \|", open(options_md).read()))
check(len(env_names) > 20, "no settings read from --help-markdown")

compose = yaml.safe_load(open(os.path.join(src, "docker/docker-compose.yml")))
cworker = compose["services"]["worker"]
cenv = cworker["environment"]
default = lambda v: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(v))
partitions = int(default(compose["services"]["kafka-init"]["environment"]["PARTITIONS"]))

dep = docs.get("Deployment", {})
check(dep.get("apiVersion") == "apps/v1", "Deployment apiVersion is not apps/v1")
spec = dep.get("spec", {})
tmpl = spec.get("template", {})
sel = spec.get("selector", {}).get("matchLabels", {})
labels = tmpl.get("metadata", {}).get("labels", {})
check(sel and all(labels.get(k) == v for k, v in sel.items()), "selector does not match the pod labels")
containers = tmpl.get("spec", {}).get("containers", [])
check(len(containers) == 1, "want one container")
c = containers[0] if containers else {}
check(c.get("image") == cworker["image"], f"image {c.get('image')} is not compose's {cworker['image']}")
env = {e["name"]: e for e in c.get("env", [])}
for name in env:
    check(name in env_names or name.startswith("KGEN_RDKAFKA_"), f"{name} is not a kgen-worker setting")
for name in cenv:
    check(name in env, f"compose gives workers {name}; the Deployment does not")
for name, e in env.items():
    check("value" in e or "valueFrom" in e, f"{name} has no value")
val = lambda n: str(env.get(n, {}).get("value", ""))
check(val("KGEN_BACKEND") == "cuda", "the GPU Deployment does not run --backend cuda")
check(str(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")) == "1", "no GPU limit")
ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
check(str(ports.get("metrics")) == val("KGEN_HTTP_PORT"), "the metrics port is not KGEN_HTTP_PORT")
check(c.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", "readiness is not /readyz")
check(c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", "liveness is not /healthz")
grace = tmpl.get("spec", {}).get("terminationGracePeriodSeconds", 30)
check(grace > float(val("KGEN_DRAIN_TIMEOUT") or 30), "terminationGracePeriodSeconds is not above the drain timeout")
mounts = {m["name"] for m in c.get("volumeMounts", [])}
vols = {v["name"] for v in tmpl.get("spec", {}).get("volumes", [])}
check(mounts <= vols, "a volumeMount without a volume")
check(val("KGEN_MODEL").startswith("/models/"), "KGEN_MODEL is not under the /models mount")

so = docs.get("ScaledObject", {})
check(so.get("apiVersion") == "keda.sh/v1alpha1", "ScaledObject apiVersion is not keda.sh/v1alpha1")
sspec = so.get("spec", {})
check(sspec.get("scaleTargetRef", {}).get("name") == dep.get("metadata", {}).get("name"),
      "the ScaledObject does not scale the Deployment")
check(1 <= sspec.get("minReplicaCount", 0) <= sspec.get("maxReplicaCount", 0) <= partitions,
      f"replica bounds not within 1..{partitions} partitions")
triggers = {t["type"]: t.get("metadata", {}) for t in sspec.get("triggers", [])}
k = triggers.get("kafka", {})
for field in ("bootstrapServers", "consumerGroup", "topic", "lagThreshold"):
    check(field in k, f"kafka trigger: no {field}")
check(k.get("consumerGroup") == val("KGEN_GROUP_ID"), "the kafka trigger's group is not KGEN_GROUP_ID")
check(k.get("topic") == val("KGEN_JOBS_TOPIC"), "the kafka trigger's topic is not KGEN_JOBS_TOPIC")
check(k.get("bootstrapServers") == val("KGEN_BROKERS"), "the kafka trigger's brokers are not KGEN_BROKERS")
check(str(k.get("lagThreshold", "")).isdigit(), "lagThreshold is not a number")
prom = triggers.get("prometheus")
if prom is not None:
    served = set(re.findall(r'"(kgen_[a-z_]+)"', open(os.path.join(src, "src/kafka/kg_http.c")).read()))
    names = set(re.findall(r"kgen_[a-z_]+", prom.get("query", "")))
    check(names and names <= served, f"the Prometheus query names {names - served or names}, not served")
    check("threshold" in prom and "serverAddress" in prom, "prometheus trigger: no threshold or serverAddress")
if errors:
    for e in errors:
        print("FAIL: " + e, file=sys.stderr)
    sys.exit(1)
print(f"k8s manifests: {len(env)} env settings, image {c['image']}, KEDA on "
      f"{k['consumerGroup']}/{k['topic']} up to {sspec['maxReplicaCount']} of {partitions} partitions")
PY
