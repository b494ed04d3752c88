#!/usr/bin/env bash
# test_docs: the documentation stays true to the code and reachable.
# - docs/CONFIGURATION.md's option table is exactly `kgen-worker --help-markdown`
#   (scripts/gen-config-doc rewrites it);
# - the README stays under 300 lines, and every page in docs/ is linked from it;
# - every relative link in README.md, CONTRIBUTING.md, gpu/README.md and docs/*.md names a file
#   that exists.
set -euo pipefail
root=${KG_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
bin=${KG_BIN_DIR:-$root/build/bin}
table=$(mktemp)
trap 'rm -f "$table"' EXIT
"$bin/kgen-worker" --help-markdown >"$table"
python3 - "$root" "$table" <<'PY'
import os, re, sys
root, table = sys.argv[1], open(sys.argv[2]).read().strip()
fails = []
page = open(os.path.join(root, "docs/CONFIGURATION.md")).read()
begin, end = "<!-- BEGIN kgen-worker --help-markdown -->", "<!-- END kgen-worker --help-markdown -->"
if begin not in page or end not in page:
    fails.append("docs/CONFIGURATION.md: the generated-table markers are missing")
else:
    doc = page[page.index(begin) + len(begin):page.index(end)].strip()
    if doc != table:
        fails.append("docs/CONFIGURATION.md: the option table differs from `kgen-worker "
                     "--help-markdown` (run scripts/gen-config-doc)")
readme = open(os.path.join(root, "README.md")).read()
n = readme.count("\n")
if n >= 300:
    fails.append(f"README.md: {n} lines (the README stays under 300; move detail to docs/)")
link = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
for md in sorted(os.listdir(os.path.join(root, "docs"))):
    if md.endswith(".md") and f"docs/{md}" not in readme:
        fails.append(f"docs/{md}: not linked from README.md")
pages = ["README.md", "CONTRIBUTING.md", "gpu/README.md"] + [f"docs/{m}" for m in os.listdir(os.path.join(root, "docs")) if m.endswith(".md")]
n_links = 0
for p in pages:
    here = os.path.dirname(os.path.join(root, p))
    for target, _ in link.findall(open(os.path.join(root, p)).read()):
        if re.match(r"^[a-z]+:", target):
            continue
        n_links += 1
        if not os.path.exists(os.path.normpath(os.path.join(here, target))):
            fails.append(f"{p}: link to {target}, which does not exist")
if fails:
    print("\n".join(fails))
    sys.exit(1)
print(f"docs: option table matches --help-markdown; README {n} lines; {n_links} relative links resolve")
PY
