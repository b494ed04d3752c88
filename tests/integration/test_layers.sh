#!/usr/bin/env bash
# test_layers: the build shows the layers. Every #include "..." of a file under src/ or gpu/
# names a folder its layer may use (docs/CONVENTIONS.md §1): base (core, model) < engine
# (backend, engine, grammar) < service (metrics, jinja < schema, config < pipeline < kafka) < cli; gpu/
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
    # the Jinja interpreter for chat templates: plain C over core; schema feeds it JSON
    "jinja": {"core"},
    "schema": {"core", "model", "grammar", "jinja"},
    "pipeline": {"core", "model", "backend", "engine", "grammar", "metrics", "schema", "jinja"},
    # kafka builds its engine stack through pipeline/kg_stack, so it calls no engine code; only
    # kg_http.c still names backend/ (kg_backend_counters_t, for /metrics)
    "kafka": {"core", "model", "backend", "grammar", "metrics", "schema", "pipeline", "config",
              "jinja"},
    "cli": {"core", "model", "backend", "engine", "grammar", "metrics", "schema", "pipeline",
            "config", "kafka", "jinja"},
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

# Files stay small and modules call downward. Two more house rules (issue 28):
# - no file in src/ or gpu/ above 1,000 lines, unless it is one idea and its opening comment says
#   so in a line that begins "One idea:";
# - no two files call each other, directly or round a longer loop, unless they are one module
#   split for reading (the files of one folder whose names share their first two words, as
#   kg_worker.c and kg_worker_produce.c, which share kg_worker_int.h). The calls are read from
#   the built objects (nm), so this part needs the build (KG_BIN_DIR/..).
python3 - "$root" "${KG_BIN_DIR:+$(dirname "$KG_BIN_DIR")}" <<'PY'
import collections, os, re, subprocess, sys
root, build = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
bad, n_big = [], 0
for top in ("src", "gpu"):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for f in files:
            if not f.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, f)
            text = open(path, encoding="utf-8", errors="replace").read()
            if text.count("\n") > 1000:
                n_big += 1
                head = text[:4000]
                if not re.search(r"^\s*(\*|//)?\s*One idea:", head, re.M):
                    bad.append(f"{os.path.relpath(path, root)}: {text.count(chr(10))} lines and no "
                               "'One idea:' line in its opening comment (split it, or say why not)")
if build and os.path.isdir(build):
    defs, uses = {}, collections.defaultdict(set)
    for dirpath, _, files in os.walk(build):
        if "/CMakeFiles/kg_" not in dirpath + "/" or "/src/" not in dirpath + "/":
            continue
        for f in files:
            if not f.endswith(".o"):
                continue
            src = os.path.join(dirpath, f).split(".dir/", 1)[1][:-2]
            for line in subprocess.run(["nm", os.path.join(dirpath, f)], capture_output=True,
                                       text=True).stdout.splitlines():
                p = line.split()
                if len(p) == 3 and p[1] in "TDBR":
                    defs[p[2]] = src
                elif len(p) == 2 and p[0] == "U":
                    uses[src].add(p[1])
    def module(src):
        d, f = os.path.split(src)
        return d + "/" + "_".join(f.rsplit(".", 1)[0].split("_")[:2])
    graph = collections.defaultdict(set)
    for src, syms in uses.items():
        for s in syms:
            t = defs.get(s)
            if t and t != src:
                graph[src].add(t)
    # Tarjan's strongly connected components of the file graph: files that call each other,
    # directly or round a longer loop. Inside one module (kg_worker.c and kg_worker_intake.c,
    # sharing kg_worker_int.h) that is one idea split for reading; across modules it is a loop.
    index, low, stack, on, n = {}, {}, [], set(), [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len({module(f) for f in comp}) > 1:
                bad.append("files of different modules that call each other in a loop: " +
                           ", ".join(sorted(comp)))
    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    n_cross = sum(1 for a, bs in graph.items() for b in bs if module(a) != module(b))
    calls = f"; {n_cross} file-to-file call edges across modules, no loop"
    if not defs:
        bad.append(f"no objects found under {build}: build first")
else:
    calls = " (call loops not checked: no build; run it through ctest)"
if bad:
    print("\n".join(bad))
    sys.exit(1)
print(f"house: {n_big} files above 1,000 lines, each one idea{calls}")
PY
