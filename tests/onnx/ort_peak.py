"""onnxruntime's peak working memory for one inference run, to set beside memc's arena.

usage: ort_peak.py MODEL.onnx

Runs the model three times on the CPU provider (one thread, memory pattern on, CPU arena
off so every allocation goes through malloc) while a thread samples glibc's mallinfo2();
prints the largest growth of in-use heap bytes over a run's start, for the last run (when
the memory pattern planned in the first run is in use). Weights are allocated before the
runs, so the figure is activations, outputs and kernel scratch.
"""
import ctypes
import sys
import threading

import numpy as np
import onnxruntime as ort


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = MallInfo2


def in_use():
    m = LIBC.mallinfo2()
    return m.uordblks + m.hblkhd


def main():
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    opts.enable_cpu_mem_arena = False
    session = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.normal(size=[d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
        for i in session.get_inputs()
    }
    for _ in range(3):
        base = in_use()
        peak = [base]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], in_use())

        t = threading.Thread(target=sample)
        t.start()
        session.run(None, feeds)
        done.set()
        t.join()
    print(f"onnxruntime peak heap growth during a run: {peak[0] - base} bytes")


if __name__ == "__main__":
    main()
