#!/usr/bin/env bash
# What the compiler made of the CUDA kernels, read from the build's machine code (no GPU needed):
# per kernel and architecture, registers, stack and spills, static shared memory, and counts of
# tensor-core products (HMMA), matrix loads from shared memory (LDSM), plain shared loads (LDS),
# subroutine calls (CALL) and spill traffic (LDL/STL), overall and inside loops (an instruction is
# "in a loop" when it lies between a backward branch and its target), and shared loads per HMMA.
# Instructions predicated never to execute (@!PT, padding the compiler puts after cp.async) are
# not counted, nor calls one or two instructions ahead (over a loop's back branch: how sm_7x/8x
# code leaves a loop, not a subroutine).
#
#   launch/sass-report.sh [--json FILE] [--arch 80,90] [--check] [LIBRARY_OR_OBJECT]
# --check: exit 1 unless every tensor-core kernel (one with HMMA) meets the targets of issue 13:
# LDSM inside its loops, at most 1 plain shared load per HMMA, no subroutine call inside loops,
# no spill instruction.
# LIBRARY_OR_OBJECT defaults to build/kernels/cuda/libringattn_kernels_cuda.a. The disassembler is
# cuobjdump from PATH, the CUDA toolkit (/usr/local/cuda/bin), or a Python package that carries it
# (triton, nvidia-cuda-cuobjdump); RINGATTN_CUOBJDUMP overrides. Exit 0, or 2 when no
# disassembler or no library is found.
set -euo pipefail
cd "$(dirname "$0")/.."

json=
check=0
archs=80,90
lib=build/kernels/cuda/libringattn_kernels_cuda.a
while [ $# -gt 0 ]; do
  case $1 in
    --json) json=$2; shift 2 ;;
    --arch) archs=$2; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) lib=$1; shift ;;
  esac
done
[ -e "$lib" ] || { echo "sass-report: $lib not found (build ringattn_kernels_cuda first)" >&2; exit 2; }

find_cuobjdump() {
  [ -n "${RINGATTN_CUOBJDUMP:-}" ] && { echo "$RINGATTN_CUOBJDUMP"; return; }
  command -v cuobjdump 2>/dev/null && return
  for c in /usr/local/cuda/bin/cuobjdump /usr/local/cuda-*/bin/cuobjdump; do [ -x "$c" ] && { echo "$c"; return; }; done
  for py in python3 /usr/bin/python3 /opt/torchenv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    local d
    d=$("$py" - <<'EOF' 2>/dev/null || true
import importlib.util, os
for name in ("triton", "nvidia.cuda_cuobjdump", "nvidia"):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        continue
    if spec and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for dirpath, _, files in os.walk(root):
                if "cuobjdump" in files:
                    print(os.path.join(dirpath, "cuobjdump")); raise SystemExit
EOF
)
    [ -n "$d" ] && [ -x "$d" ] && { echo "$d"; return; }
  done
}
cuobjdump=$(find_cuobjdump || true)
[ -n "$cuobjdump" ] || { echo "sass-report: no cuobjdump (install the CUDA toolkit or pip install nvidia-cuda-cuobjdump)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for a in ${archs//,/ }; do
  "$cuobjdump" -arch "sm_$a" -res-usage "$lib" > "$tmp/res_$a.txt" 2>/dev/null || true
  "$cuobjdump" -arch "sm_$a" -sass "$lib" > "$tmp/sass_$a.txt" 2>/dev/null || true
done
filt=$(command -v c++filt || echo cat)

python3 - "$tmp" "$archs" "$json" "$filt" "$check" <<'EOF'
import json, re, subprocess, sys
tmp, archs, json_out, filt, check = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4], sys.argv[5] == "1"

def demangle(names):
    if filt == "cat" or not names:
        return dict(zip(names, names))
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out if len(out) == len(names) else names))

def short(mangled, name):
    # ringattn::kernels::gpu::(anonymous namespace)::forward_kernel<__nv_bfloat16, 64, ...::ForwardShape<64, 64,
    # true, 3, 0> >(...) -> ("mma_forward:forward_kernel<bf16,64>", "64,true,3", 0): the tile shape's arguments
    # but the last, which is the architecture family the shape's body is compiled for (0: every family).
    name = name.replace("(anonymous namespace)", "anon")
    shape = re.search(r"\w+Shape<([^<>]*)>", name)
    args = shape.group(1).replace(" ", "").split(",") if shape else []
    if shape:
        name = name[:shape.start()].rsplit(",", 1)[0] + ">" + name[shape.end():].lstrip(" >")
    m = re.search(r"([A-Za-z_0-9]+)(<[^()]*>)?\(", name)
    base = (m.group(1) + (m.group(2) or "")) if m else name
    base = base.replace("__nv_bfloat16", "bf16").replace("__half", "fp16").replace(" ", "")
    source = re.search(r"_attention_(\w+?)_cu_", mangled)  # kernels of an unnamed namespace carry their file
    return (f"{source.group(1)}:{base}" if source else base), ",".join(args[1:-1]), int(args[-1]) if args else 0
rows = []
for arch in archs:
    res = {}
    try:
        text = open(f"{tmp}/res_{arch}.txt").read()
    except OSError:
        text = ""
    for m in re.finditer(r"Function (\S+):\s*\n?\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text):
        res[m.group(1)] = dict(reg=int(m.group(2)), stack=int(m.group(3)), shared=int(m.group(4)),
                               local=int(m.group(5)))
    try:
        sass = open(f"{tmp}/sass_{arch}.txt").read()
    except OSError:
        sass = ""
    functions = re.split(r"\n\s*Function : ", sass)[1:]
    names = [f.split("\n", 1)[0].strip() for f in functions]
    pretty = demangle(names)
    for name, body in zip(names, functions):
        insts = []  # (address, opcode, text)
        for line in body.split("\n"):
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);", line)
            if m and (m.group(2) or "").strip() != "@!PT":  # "@!PT": never executed (the compiler's padding)
                insts.append((int(m.group(1), 16), m.group(3), m.group(4)))
        loops = []
        for addr, op, rest in insts:
            if op.startswith("BRA") or op.startswith("JMP"):
                t = re.search(r"0x([0-9a-f]+)", rest)
                if t and int(t.group(1), 16) <= addr:
                    loops.append((int(t.group(1), 16), addr))
        def in_loop(a):
            return any(lo <= a <= hi for lo, hi in loops)
        count = {k: 0 for k in ("HMMA", "LDSM", "LDS", "CALL", "LDL", "STL")}
        loop_count = dict(count)
        for addr, op, rest in insts:
            base = op.split(".")[0]
            if base == "CALL":  # "CALL.REL.NOINC" one or two instructions ahead (over a loop's back branch) is
                t = re.search(r"0x([0-9a-f]+)", rest)  # how sm_7x/8x code leaves a loop, not a subroutine call
                if t and int(t.group(1), 16) in (addr + 16, addr + 32):
                    continue
            if base in count:
                count[base] += 1
                if in_loop(addr):
                    loop_count[base] += 1
        r = res.get(name, dict(reg=0, stack=0, shared=0, local=0))
        kernel, shape, family = short(name, pretty[name])
        if family and family != int(arch) // 10 * 10:
            continue  # a shape of the other family: an empty body here
        rows.append(dict(arch=f"sm_{arch}", kernel=kernel, shape=shape, registers=r["reg"], stack_bytes=r["stack"],
                         shared_static_bytes=r["shared"], spill_instructions=count["LDL"] + count["STL"],
                         hmma=count["HMMA"], ldsm=count["LDSM"], lds=count["LDS"], call=count["CALL"],
                         hmma_in_loops=loop_count["HMMA"], ldsm_in_loops=loop_count["LDSM"],
                         lds_in_loops=loop_count["LDS"], call_in_loops=loop_count["CALL"],
                         lds_per_hmma=round(count["LDS"] / count["HMMA"], 2) if count["HMMA"] else None,
                         lds_per_hmma_in_loops=(round(loop_count["LDS"] / loop_count["HMMA"], 2)
                                                if loop_count["HMMA"] else None)))

rows.sort(key=lambda r: (r["arch"], r["hmma"] == 0, r["kernel"]))
head = f"{'arch':6} {'kernel':40} {'shape':10} {'regs':>4} {'stack':>5} {'spill':>5} {'HMMA':>5} {'LDSM':>5} {'LDS':>5} {'CALL':>4} " \
       f"{'LDS/HMMA':>8} | in loops: {'HMMA':>5} {'LDSM':>5} {'LDS':>5} {'CALL':>4}"
print(head)
for r in rows:
    per = "-" if r["lds_per_hmma"] is None else f"{r['lds_per_hmma']:.2f}"
    print(f"{r['arch']:6} {r['kernel'][:40]:40} {r['shape'][:10]:10} {r['registers']:>4} {r['stack_bytes']:>5} {r['spill_instructions']:>5} "
          f"{r['hmma']:>5} {r['ldsm']:>5} {r['lds']:>5} {r['call']:>4} {per:>8} | "
          f"{'':>10}{r['hmma_in_loops']:>5} {r['ldsm_in_loops']:>5} {r['lds_in_loops']:>5} {r['call_in_loops']:>4}")
tc = [r for r in rows if r["hmma"]]
for arch in sorted({r["arch"] for r in tc}):
    a = [r for r in tc if r["arch"] == arch]
    h = sum(r["hmma"] for r in a); s = sum(r["lds"] for r in a)
    print(f"# {arch}: {len(a)} tensor-core kernels, HMMA {h}, LDSM {sum(r['ldsm'] for r in a)}, LDS {s} "
          f"({s / h:.2f} per HMMA), CALL {sum(r['call'] for r in a)} ({sum(r['call_in_loops'] for r in a)} in loops), "
          f"spill instructions {sum(r['spill_instructions'] for r in a)}")
misses = [f"{r['arch']} {r['kernel']}: " + ", ".join(
              m for m, bad in (("no LDSM in loops", r["ldsm_in_loops"] == 0),
                               (f"{r['lds_per_hmma']} LDS per HMMA", (r["lds_per_hmma"] or 0) > 1),
                               (f"{r['call_in_loops']} CALL in loops", r["call_in_loops"] > 0),
                               (f"{r['spill_instructions']} spill instructions", r["spill_instructions"] > 0)) if bad)
          for r in tc if r["ldsm_in_loops"] == 0 or (r["lds_per_hmma"] or 0) > 1 or r["call_in_loops"] > 0
          or r["spill_instructions"] > 0]
if json_out:
    with open(json_out, "w") as f:
        json.dump({"kernels": rows, "targets_missed": misses}, f, indent=1)
if check:
    for m in misses:
        print(f"# target missed: {m}")
    print(f"# targets: {'all met' if tc and not misses else 'MISSED'} ({len(tc)} tensor-core kernels)")
    sys.exit(0 if tc and not misses else 1)
EOF
