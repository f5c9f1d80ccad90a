"""memc against PyTorch eager on the same weights and data: losses, device memory, step time.

For one model of bench/twins.py (gpt2 or llama1b) at the given dims, it initializes the
PyTorch twin, writes its weights under memc's parameter names (`nn.Linear` weights
transposed: memc stores them [in, out]) and one batch of token ids, then trains N steps
on that batch with `memc run --params ... --input ...` and with PyTorch (AdamW with the
spec's settings, bf16 autocast when the precision is bf16) and prints, per step, both
losses and their relative difference; memc's measured device memory against its plan;
and seconds per step of each, as a ratio. `--device cpu` runs both on the CPU (the
tiny-configuration check of the weight mapping, runnable without a GPU).

Exit status 1 when a step's losses differ by more than the tolerance (`--rtol`).
"""

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twins  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The spec's `train { optimizer = adamw(...) }` for gpt2.mdl and llama7b.mdl.
ADAMW = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def memc_params(memc, spec, sets, precision):
    """memc's parameter names and shapes, in plan order."""
    cmd = [memc, "compile", spec, "--emit", "plan", "--format", "json", "--precision", precision]
    out = subprocess.run(cmd + sets, capture_output=True, text=True, check=True).stdout
    return {b["name"]: b["ty"]["shape"] for b in json.loads(out)["buffers"] if b["class"] == "param"}


def to_memc(model, names):
    """The twin's parameters under memc's names: `layers.i` is memc's `layer.i`; a bare
    parameter (`head`) is the `nn.Linear` weight of that name; linear weights transposed."""
    linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    out = {}
    for name, p in model.named_parameters():
        module, _, leaf = name.rpartition(".")
        memc = re.sub(r"^layers\.", "layer.", name)
        if memc not in names and leaf == "weight":
            memc = re.sub(r"^layers\.", "layer.", module)
        if memc not in names:
            raise SystemExit(f"twin parameter {name} has no memc counterpart")
        t = p.detach().float().cpu()
        if module in linear and leaf == "weight":
            t = t.t()
        if list(t.shape) != names[memc]:
            raise SystemExit(f"{name} -> {memc}: shape {list(t.shape)} vs {names[memc]}")
        out[memc] = t.contiguous()
    missing = set(names) - set(out)
    if missing:
        raise SystemExit(f"memc parameters without a twin: {sorted(missing)}")
    return out


def write_safetensors(path, tensors):
    """The safetensors format by hand (f32 tensors): 8-byte header length, JSON, data."""
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.numpy().astype("<f4").tobytes()
        header[name] = dict(dtype="F32", shape=list(t.shape), data_offsets=[offset, offset + len(data)])
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)


def run_memc(memc, spec, sets, precision, device, steps, params, inputs, env=None):
    """Losses of `steps` steps, seconds per step after the first (from memc's `cuda:` line;
    the CPU run's wall time over all steps, compilation included) and its `cuda:` lines;
    `env` adds environment variables."""
    cmd = [memc, "run", spec, "--device", device, "--steps", str(steps), "--precision", precision,
           "--params", params] + sets
    for name, path in inputs.items():
        cmd += ["--input", f"{name}={path}"]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    text = out.stdout + out.stderr
    losses = [float(m) for m in re.findall(r"^step\s+\d+\S*\s+(?:loss\s+)?([-0-9.eE+naif]+)", text, re.M)]
    cuda = [line for line in text.splitlines() if line.startswith("cuda:")]
    timed = [float(m) for line in cuda for m in re.findall(r"([0-9.]+) ms per step", line)]
    per_step = timed[0] / 1e3 if timed else seconds / steps
    return losses, per_step, cuda


def run_torch(model, batch, precision, device, steps):
    """Losses of `steps` AdamW steps on one batch, seconds per step after the first, and
    the peak of allocated device memory (CUDA only)."""
    model = model.to(device)
    batch = [b.to(device) for b in batch]
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16")
    losses, start = [], None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(steps):
        if step == 1:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        with autocast:
            loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if device == "cuda":
        torch.cuda.synchronize()
    per_step = (time.perf_counter() - start) / max(steps - 1, 1) if start else float("nan")
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return losses, per_step, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["gpt2", "llama1b"], required=True)
    ap.add_argument("--memc", default=os.path.join(ROOT, "target/release/memc"))
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tiny", action="store_true", help="the twin's tiny validation dims")
    ap.add_argument("--rtol", type=float, default=None, help="default 2e-2 bf16, 1e-3 fp32")
    args = ap.parse_args()
    spec_of = twins.MODELS[args.model]
    dims = spec_of["tiny"] if args.tiny else spec_of["dims"]
    spec = os.path.join(ROOT, spec_of["spec"])
    sets = [x for k, v in dims.items() for x in ("--set", f"{k}={v}")]
    rtol = args.rtol or (2e-2 if args.precision == "bf16" else 1e-3)
    torch.manual_seed(0)
    model = twins.init_(spec_of["make"](dims))
    tokens, targets = spec_of["inputs"](dims)
    names = memc_params(args.memc, spec, sets, args.precision)
    with tempfile.TemporaryDirectory() as work:
        params = os.path.join(work, "init.safetensors")
        write_safetensors(params, to_memc(model, names))
        inputs = {}
        for name, t in (("tokens", tokens), ("targets", targets)):
            inputs[name] = os.path.join(work, f"{name}.npy")
            np.save(inputs[name], t.numpy().astype(np.int32))
        memc_losses, memc_step, cuda = run_memc(
            args.memc, spec, sets, args.precision, args.device, args.steps, params, inputs
        )
        # The same step launch by launch instead of as one CUDA Graph (6 steps suffice for
        # the time per step after the first).
        launches = None
        if args.device == "cuda":
            launches = run_memc(args.memc, spec, sets, args.precision, args.device, 6, params,
                                inputs, env={"MEMC_CUDA_GRAPH": "0"})
    torch_losses, torch_step, torch_peak = run_torch(model, (tokens, targets), args.precision, args.device, args.steps)
    label = f"{args.model} {args.precision} {args.device} {dims}"
    worst = 0.0
    for i, (a, b) in enumerate(zip(memc_losses, torch_losses), 1):
        diff = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, diff)
        print(f"{args.model} step {i}: memc {a:.6f} torch {b:.6f} rel {diff:.2e}")
    print(f"{label}: losses agree within rel {worst:.2e} (tolerance {rtol:g})")
    for line in cuda:
        print(f"{label}: memc {line}")
    if torch_peak is not None:
        print(f"{label}: PyTorch max_memory_allocated {torch_peak:,} B")
    print(f"{label}: seconds per step memc {memc_step:.4f}, PyTorch eager {torch_step:.4f}, "
          f"memc / PyTorch {memc_step / torch_step:.2f}")
    if launches is not None:
        agree = launches[0] == memc_losses[:len(launches[0])]
        print(f"{label}: seconds per step memc launch by launch {launches[1]:.4f}, "
              f"graph / launches {memc_step / launches[1]:.2f}, losses bitwise equal: {agree}")
        worst = worst if agree else float("inf")
    if len(memc_losses) != args.steps or len(torch_losses) != args.steps or worst > rtol:
        print(f"{label}: FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
