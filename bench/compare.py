"""memc's arena vs PyTorch eager's peak live storage for the same training step.

For each model of twins.MODELS and each configuration (fp32, bf16 autocast, bf16 with
per-block activation checkpointing) it compiles the .mdl with the memc binary given
(`--device cuda --format json`, the twin's dims by `--set`), measures the twin with
pytorch_peak.measure (FakeTensorMode), asserts that both have the same parameter count,
and prints a Markdown table; `--out FILE` writes it there too (atomically).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_peak  # noqa: E402
import twins  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Seconds memc's layout search may take: enough to reach the lower bound on these models
# (the table marks a layout that did not with *), so the arena does not depend on load.
LAYOUT_TIME = "2"


def checkpoint_flag(memc):
    """`block` where this memc accepts `--checkpoint block` (per-block), else `sqrt`."""
    probe = [memc, "check", os.path.join(ROOT, "examples/mlp.mdl"), "--checkpoint", "block"]
    return "block" if subprocess.run(probe, capture_output=True).returncode == 0 else "sqrt"


def memc_report(memc, name, config, ckpt, optimizer_in_backward=None):
    spec = twins.MODELS[name]
    cfg = pytorch_peak.CONFIGS[config]
    cmd = [memc, "compile", os.path.join(ROOT, spec["spec"]), "--device", "cuda"]
    cmd += ["--format", "json", "--precision", "bf16" if cfg["bf16"] else "fp32"]
    cmd += ["--checkpoint", ckpt if cfg["ckpt"] else "auto", "--layout-time", LAYOUT_TIME]
    if optimizer_in_backward:
        cmd += ["--optimizer-in-backward", optimizer_in_backward]
    for k, v in spec["dims"].items():
        cmd += ["--set", f"{k}={v}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)["report"]


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def git_commit():
    """HEAD's short hash, with "+changes" when src/ or Cargo.toml differ from it."""
    git = ["git", "-C", ROOT]
    try:
        head = subprocess.run(
            git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    clean = subprocess.run(git + ["diff", "--quiet", "HEAD", "--", "src", "Cargo.toml"])
    return head if clean.returncode == 0 else head + "+changes"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memc", default=os.path.join(ROOT, "target/release/memc"))
    ap.add_argument("--models", default=",".join(twins.MODELS))
    ap.add_argument("--configs", default=",".join(pytorch_peak.CONFIGS))
    ap.add_argument("--out", help="also write the table (Markdown) to this file")
    args = ap.parse_args()
    ckpt = checkpoint_flag(args.memc)
    t0 = time.time()
    rows = []
    for name in args.models.split(","):
        for config in args.configs.split(","):
            torch_ = pytorch_peak.measure(name, config)
            rep = memc_report(args.memc, name, config, ckpt)
            after = memc_report(args.memc, name, config, ckpt, optimizer_in_backward="off")
            if rep["param_count"] != torch_["param_count"]:
                raise SystemExit(
                    f"{name}: memc has {rep['param_count']:,} parameters, the PyTorch twin "
                    f"{torch_['param_count']:,}"
                )
            arena, peak = rep["bytes"]["arena"], torch_["peak"]
            star = lambda r: "" if r["layout_optimal"] else "*"  # noqa: E731
            rows.append(
                f"| {name} | {config} | {rep['param_count']:,} | {arena:,}{star(rep)} "
                f"({gib(arena)}) | {after['bytes']['arena']:,}{star(after)} | "
                f"{peak:,} ({gib(peak)}) | "
                f"{torch_['peak_phase']} | {arena / peak:.3f} | "
                f"{after['bytes']['arena'] / peak:.3f} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
    head = [
        f"Measured {datetime.date.today().isoformat()} at memc commit {git_commit()}, "
        f"torch {torch.__version__}; fp32 and bf16 rows: memc's default plan (`--checkpoint "
        "auto` without a budget: the smaller of keep-all and pointwise recomputation), "
        f"PyTorch eager; checkpointed rows: memc `--checkpoint {ckpt}`, "
        "PyTorch torch.utils.checkpoint around every block. * : memc's layout search "
        f"stopped ({LAYOUT_TIME} s) above the lower bound.",
        "",
        "| model | config | parameters | memc arena (B) | memc arena, optimizer after "
        "backward (B) | PyTorch peak (B) | PyTorch peak in | memc / PyTorch | "
        "optimizer after backward: memc / PyTorch |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    table = "\n".join(head + rows) + "\n"
    print(table)
    print(f"({time.time() - t0:.0f} s)", file=sys.stderr)
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(table)
        os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
