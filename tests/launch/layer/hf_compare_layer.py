#!/usr/bin/env python3
"""`ringattn layer` against Hugging Face: LlamaAttention (Llama 3 rope scaling, shape from --config) and
Qwen2Attention (q/k/v biases, shape from flags) with a PEFT LoRA adapter
on q_proj, k_proj, v_proj and o_proj, loaded from the checkpoints transformers and peft write
(model.safetensors, adapter_config.json + adapter_model.safetensors), at P = 1..3 ranks.

Checks, for each model:
  - Y of the layer equals the HF attention module's output (the PEFT model's, LoRA active);
  - after --steps N of SGD on loss sum(Y * dY) with --adapter in and --save-adapter out, the saved
    adapter loads with peft.PeftModel.from_pretrained, its output equals ours, and its factors equal
    those of the same N SGD steps taken by PyTorch autograd on the HF module.
Needs torch 2.x, transformers and peft (skips, exit 0, when they are not importable):
  /opt/torchenv/bin/python tests/launch/layer/hf_compare_layer.py [--ringattn build/ringattn]
Prints the largest errors relative to the largest value of each tensor; exits 1 above the tolerance.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import torch
    import transformers
    import peft
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
except ImportError as e:  # the full stack is optional
    print(f"skipped: {e}")
    sys.exit(0)

TOL = 2e-5  # fp32 against fp32; relative to the tensor's largest value
B, L, D_MODEL, H, HKV, R, ALPHA = 2, 48, 64, 4, 2, 4, 8.0
PREFIX = "model.layers.0.self_attn."


def build(kind, theta, seed):
    torch.manual_seed(seed)
    common = dict(hidden_size=D_MODEL, num_attention_heads=H, num_key_value_heads=HKV, intermediate_size=128,
                  num_hidden_layers=1, vocab_size=32, rope_theta=theta, attn_implementation="eager")
    if kind == "llama":  # Llama 3 rope scaling, its original context short enough to matter here
        common["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    model = (LlamaForCausalLM(LlamaConfig(**common)) if kind == "llama"
             else Qwen2ForCausalLM(Qwen2Config(**common))).float().eval()
    with torch.no_grad():  # random weights and biases of a useful size
        for name, p in model.model.layers[0].self_attn.named_parameters():
            p.normal_(0.0, 0.5 if name.endswith("bias") else D_MODEL ** -0.5)
    return model


def attach_lora(model, seed):
    cfg = peft.LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                          lora_dropout=0.0, bias="none")
    pm = peft.get_peft_model(model, cfg)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:  # PEFT starts B at 0: make the adapter do something
                p.normal_(0.0, 0.3)
    return pm


def attention(pm_or_model, x):
    """The layer's attention module on x (B, L, d), causal, positions 0..L-1."""
    inner = pm_or_model.base_model.model if isinstance(pm_or_model, peft.PeftModel) else pm_or_model
    attn = inner.model.layers[0].self_attn
    pos = torch.arange(L).unsqueeze(0).expand(B, L)
    cos, sin = inner.model.rotary_emb(x, pos)
    mask = torch.full((L, L), float("-inf")).triu(1).expand(B, 1, L, L)
    return attn(x, position_embeddings=(cos, sin), attention_mask=mask)[0]


def run(exe, ranks, args):
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", exe, "layer"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                                                                     OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    if p.returncode != 0:
        sys.exit(f"ringattn layer failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    return p.stdout


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


def compare(exe, kind, work, failures):
    theta = 10000.0 if kind == "llama" else 1e6
    model = build(kind, theta, 1)
    model.save_pretrained(os.path.join(work, "base"), safe_serialization=True)
    pm = attach_lora(model, 2)
    pm.save_pretrained(os.path.join(work, "adapter"))
    torch.manual_seed(3)
    x = torch.randn(B, L, D_MODEL)
    dy = torch.randn(B, L, D_MODEL)
    np.save(os.path.join(work, "x.npy"), x.numpy())
    np.save(os.path.join(work, "dy.npy"), dy.numpy())
    with torch.no_grad():
        y_hf = attention(pm, x).numpy()
    # Llama: the shape and rope from config.json; Qwen2: from flags.
    shape = (["--config", os.path.join(work, "base", "config.json")] if kind == "llama"
             else ["--heads", str(H), "--kv-heads", str(HKV), "--rope-theta", str(theta)])
    weights = os.path.join(work, "base") if kind == "llama" else os.path.join(work, "base", "model.safetensors")
    layer = ["--x", os.path.join(work, "x.npy"), "--weights", weights,
             "--weights-prefix", PREFIX, "--adapter", os.path.join(work, "adapter"), "--causal"] + shape
    for ranks in (1, 2, 3):
        for layout in ("contiguous", "zigzag", "striped"):
            out = os.path.join(work, f"y_{ranks}_{layout}.npy")
            run(exe, ranks, layer + ["--layout", layout, "--out", out])
            e = rel_err(np.load(out), y_hf)
            print(f"{kind:6s} forward  P={ranks} {layout:10s} max rel error {e:.2e}")
            if not e <= TOL:
                failures.append(f"{kind} forward P={ranks} {layout}: {e:.2e}")

    # Training: N SGD steps on sum(Y * dY) here and in PyTorch; the saved adapter loads in peft.
    steps, lr = 3, 1e-4  # a linear loss: small steps stay in the region where the factors change smoothly
    trained = os.path.join(work, "trained")
    log = run(exe, 2, layer + ["--layout", "zigzag", "--dy", os.path.join(work, "dy.npy"), "--steps", str(steps),
                         "--optimizer", "sgd", "--lr", str(lr), "--save-adapter", trained,
                         "--out", os.path.join(work, "y_trained.npy")])
    initial = {n: p.detach().clone() for n, p in pm.named_parameters() if "lora_" in n}
    params = [p for n, p in pm.named_parameters() if "lora_" in n]
    opt = torch.optim.SGD(params, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        (attention(pm, x) * dy).sum().backward()
        opt.step()
    loaded = peft.PeftModel.from_pretrained(build(kind, theta, 1), trained).eval()
    with torch.no_grad():
        y_loaded = attention(loaded, x).numpy()
    e = rel_err(np.load(os.path.join(work, "y_trained.npy")), y_loaded)
    print(f"{kind:6s} trained  saved adapter in peft vs our Y: max rel error {e:.2e}")
    if not e <= TOL:
        failures.append(f"{kind} trained Y: {e:.2e}")
    torch_state = {n: p.detach() for n, p in pm.named_parameters() if "lora_" in n}
    loaded_state = {n: p.detach() for n, p in loaded.named_parameters() if "lora_" in n}
    # The updates (trained - initial) compared, relative to the largest update: the factors may move little.
    worst = max(float((loaded_state[n] - torch_state[n]).abs().max() / (torch_state[n] - initial[n]).abs().max())
                for n in torch_state)
    print(f"{kind:6s} trained  factor updates vs {steps} SGD steps of PyTorch autograd: max error {worst:.2e} "
          f"of the largest update")
    if not worst <= 1e-3:
        failures.append(f"{kind} trained factors: {worst:.2e}")
    with open(os.path.join(trained, "adapter_config.json")) as f:
        assert json.load(f)["r"] == R


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ringattn", default=os.path.join(os.path.dirname(__file__), "../../../build/ringattn"))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    failures = []
    with tempfile.TemporaryDirectory() as work:
        for kind in ("llama", "qwen2"):
            os.makedirs(os.path.join(work, kind))
            compare(os.path.abspath(args.ringattn), kind, os.path.join(work, kind), failures)
    if failures:
        sys.exit("FAILED: " + "; ".join(failures))
    print("all within tolerance")


if __name__ == "__main__":
    main()
