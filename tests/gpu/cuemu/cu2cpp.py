"""cu2cpp: copy gpu/ for the cuemu build, rewriting every kernel launch
`name<<<grid, block, smem, stream>>>(args)` (the one piece of CUDA syntax
C++ lacks) into `emu_launch(dim3(grid), dim3(block), std::bind(name, args))`:
the arguments are evaluated at launch, as CUDA does.

usage: cu2cpp.py SRC_DIR OUT_DIR   (.cu files become .cpp, others are copied)
"""
import re, sys, os
src_dir, out_dir = sys.argv[1], sys.argv[2]
def split_top(s):
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch in '([{': depth += 1
        if ch in ')]}': depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]
def convert(text):
    out = ''
    i = 0
    while True:
        j = text.find('<<<', i)
        if j < 0:
            out += text[i:]; break
        # kernel name: identifier before j
        m = re.search(r'([A-Za-z_][A-Za-z_0-9]*)\s*$', text[i:j])
        name_start = i + m.start(1)
        k = text.find('>>>', j)
        cfg = split_top(text[j+3:k])
        p = text.find('(', k)
        depth, q = 0, p
        while True:
            if text[q] == '(': depth += 1
            elif text[q] == ')':
                depth -= 1
                if depth == 0: break
            q += 1
        args = text[p+1:q]
        out += text[i:name_start]
        out += 'emu_launch(dim3(%s), dim3(%s), std::bind(%s, %s))' % (cfg[0], cfg[1], m.group(1), args)
        i = q + 1
    return out
os.makedirs(out_dir, exist_ok=True)
for f in os.listdir(src_dir):
    path = os.path.join(src_dir, f)
    if os.path.isdir(path): continue
    t = open(path).read()
    if f.endswith('.cu'):
        t = convert(t)
        f = f[:-3] + '.cpp'
    open(os.path.join(out_dir, f), 'w').write(t)
