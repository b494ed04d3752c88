"""cu2cpp: copy gpu/ for the cuemu build, rewriting the CUDA syntax C++ lacks:

* every kernel launch `name<<<grid, block[, smem[, stream]]>>>(args)` (name may
  carry template arguments) becomes
  `emu_launch(dim3(grid), dim3(block), smem, "name", bounds, std::bind(name, args))`,
  the arguments evaluated at launch as CUDA does, `bounds` the kernel's
  __launch_bounds__ (0 when it has none), so cuemu refuses a launch a GPU
  would refuse;
* every `__shared__` variable gets an `emu_smem(&var, sizeof(var))` after
  its declaration, so cuemu adds up the static shared memory of a launch and
  refuses more than a GPU allows.

usage: cu2cpp.py SRC_DIR OUT_DIR   (.cu files become .cpp, others are copied)
"""
import os
import re
import sys

src_dir, out_dir = sys.argv[1], sys.argv[2]


def split_top(s):
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch in '([{<':
            depth += 1
        if ch in ')]}>':
            depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def launch_bounds(text):
    """kernel name -> its __launch_bounds__ expression (first argument)"""
    bounds = {}
    for m in re.finditer(r'__global__\s+void\s+__launch_bounds__\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*'
                         r'([A-Za-z_]\w*)\s*\(', text):
        bounds[m.group(2)] = split_top(m.group(1))[0]
    return bounds


def kernel_name(text, j):
    """the callee before `<<<` at j: an identifier with optional <template args>"""
    k = j
    while k > 0 and text[k - 1].isspace():
        k -= 1
    targs = ''
    if text[k - 1] == '>':
        depth, q = 0, k - 1
        while True:
            if text[q] == '>':
                depth += 1
            elif text[q] == '<':
                depth -= 1
                if depth == 0:
                    break
            q -= 1
        targs = text[q:k]
        k = q
    m = re.search(r'([A-Za-z_]\w*)\s*$', text[:k])
    return m.start(1), m.group(1), targs


def convert_launches(text, bounds):
    out, i = '', 0
    while True:
        j = text.find('<<<', i)
        if j < 0:
            return out + text[i:]
        start, name, targs = kernel_name(text, j)
        k = text.find('>>>', j)
        cfg = split_top(text[j + 3:k])
        smem = cfg[2] if len(cfg) > 2 else '0'
        p = text.find('(', k)
        depth, q = 0, p
        while True:
            if text[q] == '(':
                depth += 1
            elif text[q] == ')':
                depth -= 1
                if depth == 0:
                    break
            q += 1
        args = text[p + 1:q]
        callee = name + targs
        bind = 'std::bind(%s%s)' % (callee, ', ' + args if args.strip() else '')
        out += text[i:start]
        out += 'emu_launch(dim3(%s), dim3(%s), (size_t)(%s), "%s", (int)(%s), %s)' % (
            cfg[0], cfg[1], smem, name, bounds.get(name, '0'), bind)
        i = q + 1


SHARED = re.compile(r'^(\s*)__shared__\s+([^;=]*?)\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*);',
                    re.M)


def convert_shared(text):
    for line in text.splitlines():
        decl = line.strip()
        if decl.startswith('__shared__') and ',' in re.sub(r'\[[^\]]*\]|\([^)]*\)', '', decl):
            sys.exit('cu2cpp: declare one __shared__ variable per statement (cuemu counts '
                     'them): ' + decl)
    return SHARED.sub(lambda m: '%s__shared__ %s %s%s; emu_smem(&%s, sizeof(%s));' % (
        m.group(1), m.group(2), m.group(3), m.group(4), m.group(3), m.group(3)), text)


os.makedirs(out_dir, exist_ok=True)
for f in os.listdir(src_dir):
    path = os.path.join(src_dir, f)
    if os.path.isdir(path):
        continue
    t = open(path).read()
    if f.endswith('.cu') or f.endswith('.cuh'):
        t = convert_shared(t)
    if f.endswith('.cu'):
        t = convert_launches(t, launch_bounds(t))
        f = f[:-3] + '.cpp'
    open(os.path.join(out_dir, f), 'w').write(t)
