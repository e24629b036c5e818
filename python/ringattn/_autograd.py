"""ringattn.attention as a torch.autograd.Function: forward keeps q, k, v, o (float32), lse and
the handle to what the ring kept; backward runs the compiled backward through the same ring (same
context, same cached plan). ringattn.unshard likewise: its backward is this rank's rows of the
gradient."""
import torch

from ._core import cuda_stream, shard, torch_forward, unshard_rows


class RingAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(fctx, q, k, v, ctx, shard_, spec):
        o, lse, qc, kc, vc, o32, saved = torch_forward(ctx, shard_, spec, q, k, v)
        fctx.save_for_backward(qc, kc, vc, o32, lse)
        fctx.ring = (ctx, shard_, spec, saved)
        fctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(fctx, dout, _dlse):
        q, k, v, o32, lse = fctx.saved_tensors
        ctx, shard_, spec, saved = fctx.ring
        if dout is None:
            dout = torch.zeros_like(q)
        dout = dout.to(q.dtype).contiguous()
        dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.empty(k.shape, dtype=torch.float32, device=q.device)
        dv = torch.empty(v.shape, dtype=torch.float32, device=q.device)
        ctx.backward(shard_, spec, q.data_ptr(), k.data_ptr(), v.data_ptr(), o32.data_ptr(), lse.data_ptr(),
                     dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), cuda_stream(q), saved)
        if q.dtype != torch.float32:
            dq, dk, dv = dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)
        return dq, dk, dv, None, None, None


class UnshardFunction(torch.autograd.Function):
    """The whole tensor from every rank's rows. When every rank computes the same loss from it,
    the gradient of a rank's rows is its rows of the whole tensor's gradient: no communication."""
    @staticmethod
    def forward(fctx, x_local, dim, layout, causal, comm, ulysses):
        fctx.sharding = (dim, layout, causal, comm, ulysses)
        return unshard_rows(x_local, dim, layout, causal, comm, ulysses)

    @staticmethod
    def backward(fctx, grad):
        dim, layout, causal, comm, ulysses = fctx.sharding
        return shard(grad, dim, layout, causal, comm, ulysses), None, None, None, None, None
