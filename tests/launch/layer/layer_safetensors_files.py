#!/usr/bin/env python3
"""`ringattn layer` reading checkpoints written by the `safetensors` package (ctest layer_safetensors_files).

A layer with biases and rotary embeddings is written twice: as .npy files (the path the fp64 tests
check) and as a sharded HF checkpoint (model.safetensors.index.json over two files, q/k in float16,
v/o in float32) with a PEFT adapter (use_rslora) written by safetensors.numpy.save_file. Both runs at
2 ranks must give the same Y and dX; --save-adapter and --merge-out FILE.safetensors must load back
with safetensors.numpy.load_file and hold the factors and W0 + (alpha / sqrt(r)) B A.
  build/pyenv/bin/python tests/launch/layer/layer_safetensors_files.py BUILD_DIR MPIEXEC [MPI flags...]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

B, L, D_MODEL, H, HKV, R, ALPHA = 2, 40, 64, 4, 2, 4, 6.0
PREFIX = "model.layers.1.self_attn."
NAMES = ["q", "k", "v", "o"]


def main():
    build, mpiexec, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    exe = os.path.join(build, "ringattn")
    rng = np.random.default_rng(5)
    D = D_MODEL // H
    outs = {"q": H * D, "k": HKV * D, "v": HKV * D, "o": D_MODEL}
    ins = {"q": D_MODEL, "k": D_MODEL, "v": D_MODEL, "o": H * D}
    dtype = {"q": np.float16, "k": np.float16, "v": np.float32, "o": np.float32}
    w0 = {p: (rng.standard_normal((outs[p], ins[p])) / np.sqrt(ins[p])).astype(dtype[p]) for p in NAMES}
    bias = {p: (0.5 * rng.standard_normal(outs[p])).astype(dtype[p]) for p in "qkv"}  # Qwen2: no o bias
    lora_a = {p: (rng.standard_normal((R, ins[p])) / np.sqrt(ins[p])).astype(np.float32) for p in "qv"}
    lora_b = {p: (0.3 * rng.standard_normal((outs[p], R))).astype(np.float32) for p in "qv"}
    x = rng.standard_normal((B, L, D_MODEL)).astype(np.float32)
    dy = rng.standard_normal((B, L, D_MODEL)).astype(np.float32)
    failures = []

    def check(what, got, want, tol):
        err = float(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max())
        scale = max(1.0, float(np.abs(want).max()))
        print(f"{what:40s} max error {err:.2e} (scale {scale:.2f})")
        if not err <= tol * scale:
            failures.append(what)

    with tempfile.TemporaryDirectory() as work:
        npy, ckpt, adapter = (os.path.join(work, n) for n in ("npy", "ckpt", "adapter"))
        for d in (npy, ckpt, adapter):
            os.makedirs(d)
        np.save(os.path.join(work, "x.npy"), x)
        np.save(os.path.join(work, "dy.npy"), dy)
        for p in NAMES:
            np.save(os.path.join(npy, f"w{p}.npy"), w0[p].astype(np.float32))
            if p in bias:
                np.save(os.path.join(npy, f"b{p}.npy"), bias[p].astype(np.float32))
            if p in lora_a:
                np.save(os.path.join(npy, f"lora_{p}_A.npy"), lora_a[p])
                np.save(os.path.join(npy, f"lora_{p}_B.npy"), lora_b[p])
        shards = {"model-00001-of-00002.safetensors": "qk", "model-00002-of-00002.safetensors": "vo"}
        weight_map = {}
        for file, ps in shards.items():
            tensors = {}
            for p in ps:
                tensors[f"{PREFIX}{p}_proj.weight"] = w0[p]
                if p in bias:
                    tensors[f"{PREFIX}{p}_proj.bias"] = bias[p]
            tensors["model.embed_tokens.weight" if ps == "qk" else "lm_head.weight"] = np.zeros((3, 2), np.float32)
            save_file(tensors, os.path.join(ckpt, file), metadata={"format": "pt"})
            weight_map.update({name: file for name in tensors})
        with open(os.path.join(ckpt, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
        lora = {}
        for p in lora_a:
            lora[f"base_model.model.{PREFIX}{p}_proj.lora_A.weight"] = lora_a[p]
            lora[f"base_model.model.{PREFIX}{p}_proj.lora_B.weight"] = lora_b[p]
        save_file(lora, os.path.join(adapter, "adapter_model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(adapter, "adapter_config.json"), "w") as f:
            json.dump({"peft_type": "LORA", "r": R, "lora_alpha": ALPHA, "use_rslora": True,
                       "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0, "bias": "none"}, f)

        def run(args):
            cmd = [mpiexec, "-np", "2"] + flags + [exe, "layer", "--x", os.path.join(work, "x.npy"), "--heads", str(H),
                                                   "--kv-heads", str(HKV), "--causal", "--rope-theta", "1000",
                                                   "--layout", "zigzag", "--dy", os.path.join(work, "dy.npy")] + args
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")

        # rslora: scaling alpha / sqrt(r) = 6 / 2 = 3, i.e. --lora-alpha 12 for the .npy files (alpha / r).
        run(["--weights", npy, "--lora-alpha", str(ALPHA * np.sqrt(R)), "--out", os.path.join(work, "y_npy.npy"),
             "--grads", os.path.join(work, "g_npy")])
        merged = os.path.join(work, "merged.safetensors")
        saved = os.path.join(work, "saved")
        run(["--weights", ckpt, "--weights-prefix", PREFIX, "--adapter", adapter,
             "--out", os.path.join(work, "y_st.npy"), "--grads", os.path.join(work, "g_st"),
             "--save-adapter", saved, "--merge-out", merged])
        check("Y: safetensors + adapter vs .npy", np.load(os.path.join(work, "y_st.npy")),
              np.load(os.path.join(work, "y_npy.npy")), 1e-6)
        check("dX: safetensors + adapter vs .npy", np.load(os.path.join(work, "g_st", "dx.npy")),
              np.load(os.path.join(work, "g_npy", "dx.npy")), 1e-6)
        back = load_file(os.path.join(saved, "adapter_model.safetensors"))
        check("--save-adapter factors", np.concatenate([back[k].ravel() for k in sorted(lora)]),
              np.concatenate([lora[k].ravel() for k in sorted(lora)]), 0.0)
        with open(os.path.join(saved, "adapter_config.json")) as f:
            config = json.load(f)
        if not (config["r"] == R and config["lora_alpha"] == ALPHA and config["use_rslora"] is True and
                sorted(config["target_modules"]) == ["q_proj", "v_proj"]):
            failures.append(f"adapter_config.json: {config}")
        m = load_file(merged)
        for p in NAMES:
            want = w0[p].astype(np.float64)
            if p in lora_a:
                want = want + ALPHA / np.sqrt(R) * lora_b[p].astype(np.float64) @ lora_a[p].astype(np.float64)
            check(f"--merge-out {p}_proj.weight", m[f"{PREFIX}{p}_proj.weight"], want, 1e-6)
            if p in bias:
                check(f"--merge-out {p}_proj.bias", m[f"{PREFIX}{p}_proj.bias"], bias[p], 0.0)
        if f"{PREFIX}o_proj.bias" in m:
            failures.append("--merge-out wrote an o_proj.bias the checkpoint does not have")
    if failures:
        sys.exit("FAILED: " + ", ".join(failures))
    print("all checks passed")


if __name__ == "__main__":
    main()
