#!/usr/bin/env bash
# test_layers: the build shows the layers. Every #include "..." of a file under src/ or gpu/
# names a folder its layer may use (docs/CONVENTIONS.md §1): base (core, model) < engine
# (backend, engine, grammar) < service (metrics, schema, config < pipeline < kafka) < cli; gpu/
# uses the base layer and the backend interface only (the engine's backend registry calls gpu/'s
# C entry point; backend/ may not), and gpu/tools/ holds programs. A new folder must be placed
# here, so the include graph between src/ folders stays without cycles.
set -euo pipefail
root=${KG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
python3 - "$root" <<'PY'
import os, re, sys
root = sys.argv[1]
allowed = {
    "core": set(),
    "model": {"core"},
    # backend/ stands below gpu/: the backend selection that calls gpu/'s C entry point is the
    # engine's (kg_backend_registry.c; the engine library links kg_cuda)
    "backend": {"core", "model"},
    "grammar": {"core", "model"},
    "engine": {"core", "model", "backend", "grammar", "gpu"},
    "metrics": {"core"},
    "config": {"core"},
    "schema": {"core", "model", "grammar"},
    "pipeline": {"core", "model", "backend", "engine", "grammar", "metrics", "schema"},
    # kafka builds its engine stack through pipeline/kg_stack, so it calls no engine code; only
    # kg_http.c still names backend/ (kg_backend_counters_t, for /metrics)
    "kafka": {"core", "model", "backend", "grammar", "metrics", "schema", "pipeline", "config"},
    "cli": {"core", "model", "backend", "engine", "grammar", "metrics", "schema", "pipeline",
            "config", "kafka"},
    "gpu": {"core", "model", "backend"},
    # gpu/tools/: programs over the CUDA backend (kgen-parity creates backends by name)
    "gpu/tools": {"core", "model", "backend", "engine", "gpu"},
}
inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
bad, n_files, n_edges = [], 0, 0
for top in ("src", "gpu"):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for f in files:
            if not f.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root).split(os.sep)
            folder = "gpu" if rel[0] == "gpu" else rel[1]
            if rel[:2] == ["gpu", "tools"]:
                folder = "gpu/tools"
            if folder not in allowed:
                bad.append(f"{'/'.join(rel)}: folder '{folder}' has no layer in test_layers.sh")
                continue
            n_files += 1
            for name in inc.findall(open(path, encoding="utf-8", errors="replace").read()):
                target = os.path.normpath(os.path.join(dirpath, name))
                if not os.path.exists(target):
                    target = os.path.normpath(os.path.join(root, "src", name))  # "core/kg_x.h" style
                if not os.path.exists(target):
                    continue  # a generated or system-like header
                t = os.path.relpath(target, root).split(os.sep)
                tfolder = "gpu" if t[0] == "gpu" else (t[1] if t[0] == "src" and len(t) > 2 else None)
                if tfolder is None or tfolder == folder:
                    continue
                n_edges += 1
                if tfolder not in allowed[folder]:
                    bad.append(f"{'/'.join(rel)} includes {'/'.join(t)}: {folder} may not use {tfolder}")
if bad:
    print("\n".join(bad))
    sys.exit(1)
print(f"layers: {n_files} files, {n_edges} includes across folders, all downward")
PY
