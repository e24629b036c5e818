"""ringattn.attention on CUDA tensors, one rank (launch/gpu-check.sh): forward and backward against a
float64 reference by the FlashAttention rule, |ring - fp64| <= 2 |torch same precision - fp64| + floor;
and ringattn.KVCache on the GPU (prefill, then decode steps) by the same rule.
The inputs are written by kernels on a side stream made current, so the call must order itself after
them on the device (torch's current stream) and torch's later kernels after its results.
Prints "skipped" and exits 0 when torch has no CUDA; exits 1 when a result is off."""
import sys

try:
    import torch
except ImportError:
    torch = None
if torch is None or not torch.cuda.is_available():
    print("cuda check: skipped: %s" % ("no torch" if torch is None else "torch.cuda is not available"))
    sys.exit(0)

import ringattn
from reference import attention, dense_mask

torch.backends.cuda.matmul.allow_tf32 = False  # the same-precision yardstick is fp32
failures = []


def run_case(name, L, H, Hkv, D, dtype, causal):
    g = torch.Generator().manual_seed(L + H)
    q, k, v, dout = (torch.randn(1, L, h, D, generator=g, dtype=torch.float64).to(dtype).double()
                     for h in (H, Hkv, Hkv, H))
    visible = dense_mask(L, causal)

    def grads(dt, device):
        # fresh leaves: .to() of the fp64 CPU tensors returns the tensor itself
        xs = [x.detach().to(device, dt).requires_grad_() for x in (q, k, v)]
        o = attention(*xs, visible.to(device))
        o.backward(dout.to(device, dt))
        return [t.detach().cpu().double() for t in [o] + [x.grad for x in xs]]

    exact = grads(torch.float64, "cpu")
    same = grads(torch.float32, "cuda")
    if dtype == torch.bfloat16:  # what bf16 storage of o and the gradients costs
        same = [x.to(torch.bfloat16).double() for x in same]

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # current stream: producers, the call and its consumers on `side`
        torch.cuda._sleep(50_000_000)  # keep the side stream busy: a call not ordered after it reads garbage
        xs = [(x.to("cuda", dtype) * 1).requires_grad_() for x in (q, k, v)]
        o = ringattn.attention(*xs, causal=causal)
        o.backward(dout.to("cuda", dtype) * 1)
        got = [t.detach().double() * 1 for t in [o] + [x.grad for x in xs]]
    side.synchronize()
    got = [t.cpu() for t in got]
    for label, r, s, e in zip(("o", "dq", "dk", "dv"), got, same, exact):
        err, yardstick = (r - e).abs().max().item(), (s - e).abs().max().item()
        floor = (1e-5 if dtype == torch.float32 else 1e-2) * max(1.0, e.abs().max().item())
        ok = err <= 2 * yardstick + floor
        print("%-22s %-3s err %.2e  torch %s %.2e  %s" % (name, label, err, str(dtype)[6:], yardstick,
                                                         "ok" if ok else "FAIL"))
        if not ok:
            failures.append((name, label))


def run_decode_case(name, L, H, Hkv, D, dtype, window_left, steps=3):
    """ringattn.KVCache(device="cuda"): a prompt prefilled, then decode steps (the CUDA decode kernel),
    every output against the float64 reference of the whole sequence, beside the same in fp32 torch."""
    g = torch.Generator().manual_seed(L + 7)
    n = L + steps
    q, k, v = (torch.randn(1, n, h, D, generator=g, dtype=torch.float64).to(dtype).double() for h in (H, Hkv, Hkv))
    visible = dense_mask(n, causal=True, window=(window_left, 0))
    exact = attention(q, k, v, visible)
    same = attention(*(x.float().cuda() for x in (q, k, v)), visible.cuda()).cpu().double()
    cache = ringattn.KVCache(1, Hkv, D, n + 16, dtype=dtype, device="cuda")
    window = (window_left, 0)
    with torch.no_grad():
        got = [ringattn.prefill(*(x[:, :L].to("cuda", dtype) for x in (q, k, v)), cache, window=window)]
        for t in range(L, n):
            got.append(ringattn.decode(*(x[:, t:t + 1].to("cuda", dtype) for x in (q, k, v)), cache, window=window))
    got = torch.cat([o.cpu().double() for o in got], dim=1)
    err, yardstick = (got - exact).abs().max().item(), (same - exact).abs().max().item()
    floor = (1e-5 if dtype == torch.float32 else 1e-2) * max(1.0, exact.abs().max().item())
    ok = err <= 2 * yardstick + floor and cache.lengths() == [n]
    print("%-22s o   err %.2e  torch %s %.2e  %s" % (name, err, str(dtype)[6:], yardstick, "ok" if ok else "FAIL"))
    if not ok:
        failures.append((name, "decode"))


assert ringattn.size() == 1, "one rank: python3 tests/python/cuda_check.py"
print("cuda check on %s" % torch.cuda.get_device_name())
run_case("causal GQA fp32", 1000, 4, 2, 64, torch.float32, True)
run_case("bf16", 1024, 4, 4, 128, torch.bfloat16, False)
run_decode_case("kv cache GQA fp32", 700, 8, 2, 64, torch.float32, -1)
run_decode_case("kv cache window bf16", 1000, 8, 2, 128, torch.bfloat16, 300)
if failures:
    print("cuda check: FAILED %s" % failures)
    sys.exit(1)
print("cuda check: passed")
