"""Reference outputs from onnxruntime for memc's ONNX import tests.

usage: reference.py MODEL.onnx OUTDIR [--random-weights]

Writes OUTDIR/model.onnx (the model, its generated weights replaced by seeded random
initializers when --random-weights), OUTDIR/input.<i>.npy for each graph input (seeded
normal data), OUTDIR/ref.<i>.npy for each graph output as onnxruntime computes it, and
OUTDIR/names.txt (one line per input/output: kind, index, ONNX name). Also prints
onnxruntime's resident-memory growth over its first run (its CPU arena keeps what it
reserved) as `ort_rss_growth_bytes N`.
"""
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def consumers(graph):
    uses = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            uses.setdefault(name, []).append((node.op_type, i))
    return uses


def random_value(shape, uses, rng):
    """Weights that keep activations of order one through deep networks."""
    ops = uses[0] if uses else ("", 0)
    if len(shape) >= 2:
        fan_in = int(np.prod(shape[1:])) if ops[0] != "Gemm" else int(shape[1])
        return rng.normal(0.0, np.sqrt(1.0 / max(fan_in, 1)), shape)
    if ops in (("BatchNormalization", 1), ("BatchNormalization", 4), ("Mul", 1), ("Mul", 0)):
        return rng.uniform(0.5, 1.5, shape)
    return rng.uniform(-0.1, 0.1, shape)


def randomize(model, rng):
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    uses = consumers(graph)
    keep = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = [int(d) for d in inits[node.input[0]]]
            value = random_value(shape, uses.get(node.output[0], []), rng).astype(np.float32)
            graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    kept_inputs = [i for i in graph.input if i.name in used or i.name not in inits]
    del graph.input[:]
    graph.input.extend(kept_inputs)


def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    src, out = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    model = onnx.load(src)
    if "--random-weights" in sys.argv:
        randomize(model, rng)
    onnx.save(model, f"{out}/model.onnx")
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    names = []
    for i, vi in enumerate(x for x in model.graph.input if x.name not in inits):
        shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.normal(0.0, 1.0, shape).astype(np.float32)
        np.save(f"{out}/input.{i}.npy", feeds[vi.name])
        names.append(f"input {i} {vi.name}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(f"{out}/model.onnx", opts, providers=["CPUExecutionProvider"])
    before = rss()
    results = session.run(None, feeds)
    print(f"ort_rss_growth_bytes {rss() - before}")
    for i, (vi, r) in enumerate(zip(session.get_outputs(), results)):
        np.save(f"{out}/ref.{i}.npy", np.asarray(r, dtype=np.float32))
        names.append(f"output {i} {vi.name}")
    with open(f"{out}/names.txt", "w") as f:
        f.write("\n".join(names) + "\n")


if __name__ == "__main__":
    main()
