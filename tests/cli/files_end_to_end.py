#!/usr/bin/env python3
"""End to end through files: `mpirun -np P ringattn --q --k --v [--dout] --out --lse --dq --dk --dv`
for several masks, layouts, dtypes and rank counts, each output compared with a NumPy fp64
reference of the same inputs. Usage: files_end_to_end.py BUILD_DIR [MPIEXEC...]
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

BUILD = sys.argv[1]
MPIEXEC = sys.argv[2:] or ["mpirun"]


def reference(q, k, v, dout, visible, scale):
    """fp64 attention of (B, L, H, D) inputs with GQA; visible: (L, L) bool."""
    B, L, H, D = q.shape
    hkv = k.shape[2]
    rep = H // hkv
    kk = np.repeat(k, rep, axis=2).astype(np.float64)
    vv = np.repeat(v, rep, axis=2).astype(np.float64)
    qq = q.astype(np.float64)
    s = np.einsum("bihd,bjhd->bhij", qq, kk) * scale
    s = np.where(visible[None, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(m)
    m = np.where(empty, 0.0, m)
    p = np.exp(s - m)
    denom = p.sum(axis=-1, keepdims=True)
    lse = np.where(empty[..., 0], -np.inf, (m + np.log(np.where(denom > 0, denom, 1.0)))[..., 0])
    pn = np.where(denom > 0, p / np.where(denom > 0, denom, 1.0), 0.0)
    o = np.einsum("bhij,bjhd->bihd", pn, vv)
    do = dout.astype(np.float64)
    dv = np.einsum("bhij,bihd->bjhd", pn, do)
    dp = np.einsum("bihd,bjhd->bhij", do, vv)
    delta = np.einsum("bihd,bihd->bhi", do, o)[..., None]
    ds = pn * (dp - delta)
    dq = np.einsum("bhij,bjhd->bihd", ds, kk) * scale
    dk = np.einsum("bhij,bihd->bjhd", ds, qq) * scale
    # fold GQA head groups back onto the kv heads
    dk = dk.reshape(B, L, hkv, rep, D).sum(axis=3)
    dv = dv.reshape(B, L, hkv, rep, D).sum(axis=3)
    return o, lse, dq, dk, dv


def visible_matrix(L, causal=False, window=None, docs=None, block=None, n=None):
    i = np.arange(L)[:, None]
    j = np.arange(L)[None, :]
    vis = np.ones((L, L), bool)
    if causal:
        vis &= j <= i
    if window:
        left, right = window
        if left >= 0:
            vis &= j >= i - left
        if right >= 0:
            vis &= j <= i + right
    if docs:
        doc = np.repeat(np.arange(len(docs)), docs)
        vis &= doc[:, None] == doc[None, :]
    if block is not None:
        vis &= block[i // n, j // n].astype(bool)
    return vis


def run(ranks, args):
    cmd = MPIEXEC + ["-np", str(ranks), os.path.join(BUILD, "ringattn")] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"FAILED (exit {r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r


def main():
    rng = np.random.default_rng(0)
    failures = 0
    cases = [
        # ranks, B, L, H, Hkv, D, mask args, mask kwargs, extra args, dtype tolerance
        (2, 1, 150, 4, 2, 32, ["--causal"], dict(causal=True), [], 2e-5),
        (2, 2, 151, 2, 2, 64, ["--window", "20,5", "--layout", "striped"], dict(window=(20, 5)), [], 2e-5),
        (3, 1, 130, 2, 1, 32, ["--doc-lens", "40,0,60,30", "--causal", "--schedule", "ring"],
         dict(causal=True, docs=[40, 0, 60, 30]), [], 2e-5),
        (2, 1, 129, 2, 2, 32, ["--causal", "--dtype", "bf16"], dict(causal=True), [], 2e-5),
        (1, 1, 100, 2, 2, 16, ["--causal", "--window", "10,-1"], dict(causal=True, window=(10, -1)), [], 2e-5),
        (2, 1, 140, 2, 2, 32, ["--block-mask", "BLOCKFILE", "--mask-block", "16", "--layout", "zigzag"],
         dict(block="random", n=16), [], 2e-5),
        (3, 1, 160, 2, 2, 32, ["--bigbird", "1,1,2", "--mask-block", "16", "--seed", "9", "--causal",
                               "--dump-block-mask", "DUMPFILE"], dict(causal=True, block="dumped", n=16), [], 2e-5),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for c, (ranks, B, L, H, Hkv, D, margs, mkw, extra, tol) in enumerate(cases):
            q = rng.standard_normal((B, L, H, D)).astype(np.float32)
            k = rng.standard_normal((B, L, Hkv, D)).astype(np.float32)
            v = rng.standard_normal((B, L, Hkv, D)).astype(np.float32)
            dout = rng.standard_normal((B, L, H, D)).astype(np.float32)
            if "bf16" in margs:  # compare on what bf16 storage keeps
                rnd = lambda x: (x.view(np.uint32) + 0x7FFF + ((x.view(np.uint32) >> 16) & 1) & 0xFFFF0000).view(np.float32)
                q, k, v, dout = rnd(q), rnd(k), rnd(v), rnd(dout)
            files = {}
            for name, arr in (("q", q), ("k", k), ("v", v), ("dout", dout)):
                files[name] = os.path.join(tmp, f"{c}_{name}.npy")
                # 3-D files for B = 1 in one case, to cover (L, H, D)
                np.save(files[name], arr[0] if (B == 1 and c == 2) else arr)
            outs = {n: os.path.join(tmp, f"{c}_{n}_out.npy") for n in ("o", "lse", "dq", "dk", "dv")}
            block_file, dump_file = os.path.join(tmp, f"{c}_block.npy"), os.path.join(tmp, f"{c}_dump.npy")
            mkw = dict(mkw)
            if mkw.get("block") == "random":
                nb = (L + mkw["n"] - 1) // mkw["n"]
                mkw["block"] = (rng.random((nb, nb)) < 0.5).astype(np.uint8)
                np.save(block_file, mkw["block"])
            margs = [block_file if a == "BLOCKFILE" else dump_file if a == "DUMPFILE" else a for a in margs]
            args = ["--q", files["q"], "--k", files["k"], "--v", files["v"], "--dout", files["dout"],
                    "--out", outs["o"], "--lse", outs["lse"], "--dq", outs["dq"], "--dk", outs["dk"],
                    "--dv", outs["dv"], "--check"] + margs + extra
            run(ranks, args)
            if mkw.get("block") == "dumped":  # the generated BigBird mask, as the job wrote it
                mkw["block"] = np.load(dump_file)
            vis = visible_matrix(L, **mkw)
            ref = reference(q, k, v, dout, vis, 1.0 / np.sqrt(D))
            for n, r in zip(("o", "lse", "dq", "dk", "dv"), ref):
                got = np.load(outs[n]).astype(np.float64)
                if n != "lse" and got.ndim == 3:
                    got = got[None]
                if got.shape != r.shape:
                    print(f"case {c} {n}: shape {got.shape} != {r.shape}")
                    failures += 1
                    continue
                fin = np.isfinite(r)
                same_inf = np.array_equal(np.isfinite(got), fin)
                err = np.abs(got[fin] - r[fin]).max() if fin.any() else 0.0
                scale = max(1.0, np.abs(r[fin]).max() if fin.any() else 1.0)
                # bf16 gradients: the kernels may round P and dS to bf16 before their products
                # (FlashAttention-2's contract, docs/kernels.md), 2^-9 of each term.
                t = 2.0 ** -6 if "bf16" in margs and n in ("dq", "dk", "dv") else tol
                ok = same_inf and err <= t * scale
                print(f"case {c} ({ranks} ranks {' '.join(os.path.basename(a) for a in margs)}) {n}: max err {err:.2e} {'ok' if ok else 'FAILED'}")
                failures += not ok
    if failures:
        raise SystemExit(f"{failures} comparisons failed")
    print("all outputs match the NumPy fp64 reference")


if __name__ == "__main__":
    main()
