"""Peak live tensor storage of one PyTorch eager training step, without running the math.

What is counted: every tensor storage that exists at any moment of the second training step
(so the optimizer state is already allocated): parameters, buffers (batch-norm running
statistics, rotary tables), inputs, optimizer state, gradients, activations saved for
backward, and every temporary an op returns (autocast's low-precision weight copies,
foreach optimizer temporaries, gradients being summed, recomputed activations under
checkpointing). A storage counts its full nbytes from the op that creates it until the
storage itself dies (views share their base's storage). What is not counted: memory a
kernel allocates and frees inside one op (cuDNN/cuBLAS workspaces, im2col buffers), the
caching allocator's rounding and fragmentation, and the CUDA context. So the figure is a
lower bound of what `torch.cuda.max_memory_allocated()` reports for the same step.

How: a TorchDispatchMode sees every aten op's inputs and outputs; the first time it sees a
storage it adds storage.nbytes() and registers a weakref finalizer on the storage object
(PyTorch keeps a storage's Python object alive exactly as long as the storage), which
subtracts it again. The model runs under FakeTensorMode (meta storages with real sizes,
no data, no compute), on the CPU; `validate` checks on tiny models that the same tracker
gives the same peak with real tensors, and that its live bytes at the end of forward
equal an independent count (every tensor the garbage collector can see plus every tensor
autograd saved).

Mixed precision emulates CUDA autocast on the CPU: torch.autocast("cpu", bfloat16) for
the low-precision ops (linear, matmul, conv, attention: the same as CUDA's list), plus
CUDA's fp32 list where the CPU's differs for the ops these models use (layer/group norm,
nearest upsampling, softmax, sum, pow, rsqrt, exp, log; see `CudaEager`); `validate`
checks the resulting dtypes. Attention is F.scaled_dot_product_attention, which
runs the flash kernel (CPU flash: output + logsumexp, like CUDA's flash kernel).
F.rms_norm (nn.RMSNorm) runs as CUDA's fused kernel does (`FusedRmsNorm`), not as the
CPU's decomposition. The optimizers run with foreach=True (their default on CUDA).
"""

import argparse
import contextlib
import gc
import json
import sys
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import twins  # noqa: E402

CONFIGS = {
    "fp32": dict(bf16=False, ckpt=False),
    "bf16": dict(bf16=True, ckpt=False),
    "bf16+ckpt": dict(bf16=True, ckpt=True),
}


# Where a meta kernel's outputs are smaller than the real kernel's, (output, real nbytes):
# aten.mse_loss's reduced 0-dim result is a view into its elementwise buffer (as large as the
# input), which stays alive as long as the loss; batch norm on a bf16 input with fp32
# weights returns fp32 batch statistics (the meta kernel says bf16).
REAL_STORAGE = {
    torch.ops.aten.mse_loss.default: lambda args, out: [
        (out, args[0].numel() * out.element_size())
    ],
    torch.ops.aten.native_batch_norm.default: lambda args, out: [
        (t, t.numel() * args[1].element_size()) for t in out[1:] if args[1] is not None
    ],
}


class LiveStorage(TorchDispatchMode):
    """Live bytes of every tensor storage an aten op touched, and their peak."""

    def __init__(self):
        super().__init__()
        self.live = {}  # storage key -> nbytes
        self.current = 0
        self.peak = 0
        self.phase = "setup"
        self.peak_phase = "setup"
        self.phase_peaks = {}

    def _free(self, key):
        self.current -= self.live.pop(key, 0)

    def _track(self, t, nbytes=None):
        st = t.untyped_storage()
        key, n = st._cdata, st.nbytes() if nbytes is None else nbytes
        old = self.live.get(key)
        if old is None:
            weakref.finalize(st, self._free, key)
            old = 0
        if n > old:  # new, or grown by an out= kernel
            self.live[key] = n
            self.current += n - old
            if self.current > self.peak:
                self.peak, self.peak_phase = self.current, self.phase
            if self.current > self.phase_peaks.get(self.phase, 0):
                self.phase_peaks[self.phase] = self.current

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves = pytree.tree_leaves(out)
        if func in REAL_STORAGE and any(isinstance(t, FakeTensor) for t in leaves):
            for t, nbytes in REAL_STORAGE[func](args, out):
                self._track(t, nbytes)
        for t in pytree.tree_leaves((args, kwargs)) + leaves:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def reset_peak(self):
        self.peak, self.peak_phase = self.current, self.phase
        self.phase_peaks = {}


def _bf16(t):
    return isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16)


class FusedRmsNorm(torch.autograd.Function):
    """F.rms_norm as CUDA runs it (aten._fused_rms_norm): saves the input and the fp32
    reciprocal RMS only; on the CPU, F.rms_norm decomposes into pow/mean/rsqrt/mul, whose
    autograd also saves the normalized tensor. Backward frees its temporaries early (up to
    three input-sized temporaries at once; the CUDA kernel needs one, its output)."""

    @staticmethod
    def forward(ctx, x, shape, weight, eps):
        dims = tuple(range(-len(shape), 0))
        sq = x.to(torch.promote_types(x.dtype, torch.float32)).pow(2)
        rstd = sq.mean(dims, keepdim=True).add_(eps).rsqrt_()
        del sq
        out = (x * rstd).to(x.dtype)
        if weight is not None:
            out.mul_(weight)
        ctx.save_for_backward(x, rstd, weight)
        ctx.dims = dims
        return out

    @staticmethod
    def backward(ctx, g):
        x, rstd, weight = ctx.saved_tensors
        xhat = x * rstd
        grad_w = None
        if weight is not None:
            outer = tuple(range(g.dim() - len(ctx.dims)))
            grad_w = (g * xhat).sum(outer)
            g = g * weight
        dot = (g * xhat).mean(ctx.dims, keepdim=True)
        grad_x = (g - xhat.mul_(dot)).mul_(rstd)
        return grad_x, None, grad_w, None


class CudaEager(TorchFunctionMode):
    """What differs between CUDA and CPU eager for these models, done the CUDA way.

    F.rms_norm runs as `FusedRmsNorm`. While CPU autocast is on, the ops CUDA autocast
    runs in fp32 run in fp32.

    CUDA autocast casts the inputs of its fp32-list ops (layer_norm, group_norm,
    upsample_nearest, pow, rsqrt, exp, log, softplus, mse_loss, nll_loss) to fp32 and runs
    softmax, log_softmax, sum, cumsum and prod with dtype=float32 (for a bf16 input that
    is a cast too). CPU autocast leaves norms, upsampling and softmax in bf16. Both cast
    cross_entropy's bf16 logits to fp32 before log_softmax.
    """

    CAST = {
        F.layer_norm, F.group_norm, F.interpolate, F.mse_loss, F.nll_loss, F.softplus,
        torch.exp, torch.Tensor.exp, torch.pow, torch.Tensor.pow, torch.rsqrt,
        torch.Tensor.rsqrt, torch.log, torch.Tensor.log,
    }
    OPT_DTYPE = {
        F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, torch.Tensor.softmax,
        torch.Tensor.log_softmax, torch.sum, torch.Tensor.sum, torch.cumsum,
        torch.Tensor.cumsum, torch.prod, torch.Tensor.prod,
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        autocast = torch.is_autocast_enabled("cpu")
        if func is F.rms_norm:
            x, shape, weight, eps = (list(args) + [None, None])[:4]
            x, shape = kwargs.get("input", x), kwargs.get("normalized_shape", shape)
            weight, eps = kwargs.get("weight", weight), kwargs.get("eps", eps)
            if autocast and _bf16(x):
                x = x.float()
            eps = torch.finfo(x.dtype).eps if eps is None else eps
            return FusedRmsNorm.apply(x, tuple(shape), weight, eps)
        if autocast:
            if func in self.CAST:
                args, kwargs = pytree.tree_map(
                    lambda t: t.float() if _bf16(t) else t, (args, kwargs)
                )
            elif func in self.OPT_DTYPE and _bf16(args[0]) and kwargs.get("dtype") is None:
                kwargs = dict(kwargs, dtype=torch.float32)
        return func(*args, **kwargs)


def make_optimizer(kind, params):
    if kind == "sgd":  # examples/resnet18.mdl: sgd(lr = 0.1, momentum = 0.9, wd = 1e-4)
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True)
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True)


def train_step(model, inputs, opt, cfg, clip, tracker, after_forward=None):
    """forward (under autocast for bf16), backward, [clip], optimizer.step, zero_grad."""
    tracker.phase = "forward"
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if cfg["bf16"] else contextlib.nullcontext()
    with amp:
        loss = model(*inputs)
    if after_forward:
        after_forward()
    tracker.phase = "backward"
    loss.backward()
    tracker.phase = "update"
    if clip:
        nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def storage_bytes(tensors):
    """Bytes of the distinct storages under the given tensors."""
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def measure(name, config, fake=True, tiny=False, check=None):
    """Peak live bytes of the second training step of twin `name` in `config`."""
    spec = twins.MODELS[name]
    dims = spec["tiny" if tiny else "dims"]
    cfg = CONFIGS[config]
    tracker = LiveStorage()
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with mode, tracker, CudaEager():
        torch.manual_seed(0)
        model = twins.init_(spec["make"](dims))
        model.checkpoint = cfg["ckpt"]
        # Torch function modes are off while autograd runs backward, so a checkpointed
        # block's recomputation enters CudaEager again itself.
        model.block_context = CudaEager
        inputs = spec["inputs"](dims)
        opt = make_optimizer(spec["optimizer"], model.parameters())
        clip = spec.get("clip")
        train_step(model, inputs, opt, cfg, clip, tracker)  # allocates the optimizer state
        gc.collect()
        tracker.phase = "start"
        tracker.reset_peak()
        start = tracker.current
        params = list(model.parameters())
        state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        after_forward = check and (lambda: check(tracker))
        loss = train_step(model, inputs, opt, cfg, clip, tracker, after_forward)
        result = dict(
            model=name,
            config=config,
            param_count=sum(p.numel() for p in params),
            peak=tracker.peak,
            peak_phase=tracker.peak_phase,
            phase_peaks=dict(tracker.phase_peaks),
            start=start,
            params=storage_bytes(params),
            buffers=storage_bytes(list(model.buffers())),
            optimizer_state=storage_bytes(state),
            inputs=storage_bytes(inputs),
            loss_finite=None if fake else bool(torch.isfinite(loss).item()),
        )
    return result


def live_by_gc_and_autograd(saved):
    """Live storage bytes as the garbage collector and autograd see them (tracker-free)."""
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    seen = {}
    for t in tensors + [s() for s in saved if s() is not None]:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def autocast_dtypes():
    """Output dtypes under CPU autocast + CudaEager, and the ops cross_entropy ran."""
    x = torch.randn(2, 8, 4, 4, dtype=torch.bfloat16)
    y = torch.randn(4, 16, dtype=torch.bfloat16)
    w = torch.randn(16, 16)
    seen = []

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with torch.autocast("cpu", dtype=torch.bfloat16), CudaEager():
        got = {
            "linear": F.linear(w, w).dtype,
            "layer_norm": F.layer_norm(y, (16,)).dtype,
            "group_norm": F.group_norm(x, 4).dtype,
            "upsample_nearest": F.interpolate(x, scale_factor=2).dtype,
            "softmax": F.softmax(y, -1).dtype,
            "silu": F.silu(y).dtype,
        }
        with Ops():
            F.cross_entropy(y, torch.zeros(4, dtype=torch.int64))
    return got, seen


# What CUDA autocast gives for each (torch/csrc/autograd/autocast_mode.cpp's op lists).
CUDA_AUTOCAST = {
    "linear": torch.bfloat16, "layer_norm": torch.float32, "group_norm": torch.float32,
    "upsample_nearest": torch.float32, "softmax": torch.float32, "silu": torch.bfloat16,
}


def validate():
    """Fake vs real peaks on tiny twins, and the end-of-forward count vs an independent one."""
    got, ce_ops = autocast_dtypes()
    ce_cuda = ["aten.zeros", "aten._to_copy", "aten._log_softmax", "aten.nll_loss_forward"]
    failures = int(got != CUDA_AUTOCAST or ce_ops != ce_cuda)
    print(("ok   " if not failures else "FAIL ") + f"autocast dtypes {got}, cross_entropy: "
          f"{' '.join(ce_ops)}", flush=True)
    for name in twins.MODELS:
        for config in CONFIGS:
            real_check = {}
            saved = []

            def check(tracker, real_check=real_check, saved=saved):
                real_check["tracker"] = tracker.current
                real_check["independent"] = live_by_gc_and_autograd(saved)

            hooks = (
                torch.autograd.graph.saved_tensors_hooks(
                    lambda t: (saved.append(weakref.ref(t)), t)[1], lambda t: t
                )
                if not CONFIGS[config]["ckpt"]
                else contextlib.nullcontext()
            )
            fake = measure(name, config, fake=True, tiny=True)
            with hooks:
                real = measure(name, config, fake=False, tiny=True,
                               check=None if CONFIGS[config]["ckpt"] else check)
            ok = fake["phase_peaks"] == real["phase_peaks"] and real["loss_finite"]
            phases = " ".join(f"{k} {v:,}" for k, v in fake["phase_peaks"].items())
            line = f"{name:10} {config:10} peak in {phases}"
            if fake["phase_peaks"] != real["phase_peaks"]:
                line += f" (real: {real['phase_peaks']})"
            if real_check:
                same = real_check["tracker"] == real_check["independent"]
                ok = ok and same
                line += (f"  end of forward: tracker {real_check['tracker']:,}"
                         f" independent {real_check['independent']:,}")
            print(("ok   " if ok else "FAIL ") + line, flush=True)
            failures += not ok
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="JSON lines: one per model and config")
    m.add_argument("--models", default=",".join(twins.MODELS))
    m.add_argument("--configs", default=",".join(CONFIGS))
    sub.add_parser("validate", help="fake vs real tracker on tiny models")
    args = ap.parse_args()
    if args.cmd == "validate":
        sys.exit(1 if validate() else 0)
    for name in args.models.split(","):
        for config in args.configs.split(","):
            print(json.dumps(measure(name, config)), flush=True)


if __name__ == "__main__":
    main()
