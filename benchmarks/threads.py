"""Issue 19: what calls from several threads cost (docs/threads.md: frames per call, a lock
per updated shared variable, one GPU call at a time per context).

    python3 benchmarks/threads.py              # CPU
    python3 benchmarks/threads.py --device cuda  # GPU machine (one context, its call lock)

For 1, 2, 4 and 8 threads, each making the same number of calls: total calls per second of
a function without updates (an MLP forward pass on a batch) and of a training step that
updates its weights, beside PyTorch doing the same from the same threads.  The ratio to one
thread shows what the frames and locks cost (CPU) or what the context lock serialises (GPU).
"""
from __future__ import annotations

import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DEVICE = "cuda" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cuda" \
    else "cpu"
os.environ.setdefault("SYMGPU_FLAGS", f"device={DEVICE},floatX=float32")
# one BLAS thread per calling thread (NumPy's and PyTorch's alike): BLAS threads started by
# every product of several callers oversubscribe the cores (docs/threads.md); set these
# yourself to time something else
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

BATCH, FEATS, HIDDEN, CLASSES = 64, 256, 256, 10
CALLS = 400 if DEVICE == "cuda" else 200
THREADS = (1, 2, 4, 8)


def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((BATCH, FEATS)).astype("float32")
    Y = rng.integers(0, CLASSES, BATCH).astype("int32")
    W1 = (rng.standard_normal((FEATS, HIDDEN)) * 0.05).astype("float32")
    W2 = (rng.standard_normal((HIDDEN, CLASSES)) * 0.05).astype("float32")
    return X, Y, W1, W2


def symgpu_fns():
    import symgpu
    import symgpu.tensor as T
    X, Y, W1, W2 = data()
    w1, w2 = symgpu.shared(W1, name="w1"), symgpu.shared(W2, name="w2")
    x, y = T.fmatrix("x"), T.ivector("y")
    p = T.nnet.softmax(T.dot(T.tanh(T.dot(x, w1)), w2))
    predict = symgpu.function([x], p.argmax(axis=1))
    cost = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
    g1, g2 = T.grad(cost, [w1, w2])
    step = symgpu.function([x, y], cost, updates=[(w1, w1 - 0.01 * g1), (w2, w2 - 0.01 * g2)])
    return (lambda: predict(X)), (lambda: step(X, Y))


def torch_fns():
    import torch
    X, Y, W1, W2 = data()
    dev = "cuda" if DEVICE == "cuda" else "cpu"
    x, y = torch.tensor(X, device=dev), torch.tensor(Y, device=dev).long()
    w1 = torch.tensor(W1, device=dev, requires_grad=True)
    w2 = torch.tensor(W2, device=dev, requires_grad=True)
    lock = threading.Lock()   # torch's in-place SGD from threads needs the user's own lock

    def predict():
        with torch.no_grad():
            return torch.softmax(torch.tanh(x @ w1) @ w2, 1).argmax(1).cpu()

    def step():
        with lock:
            cost = torch.nn.functional.cross_entropy(torch.tanh(x @ w1) @ w2, y)
            g1, g2 = torch.autograd.grad(cost, [w1, w2])
            with torch.no_grad():
                w1.sub_(0.01 * g1)
                w2.sub_(0.01 * g2)
            return cost.item()
    return predict, step


def throughput(fn, n_threads: int) -> float:
    """Calls per second with `n_threads` threads making CALLS calls each."""
    t_end = time.perf_counter() + 1.0    # past the first calls (kernels still compiling)
    while time.perf_counter() < t_end:
        fn()
    start = threading.Barrier(n_threads + 1)

    def work():
        start.wait()
        for _ in range(CALLS):
            fn()
    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return n_threads * CALLS / (time.perf_counter() - t0)


def main() -> None:
    contenders = [("symgpu", symgpu_fns)]
    try:
        import torch  # noqa: F401
        contenders.append(("PyTorch", torch_fns))
    except ImportError:
        print("PyTorch not installed: symgpu only")
    print(f"device {DEVICE}; {CALLS} calls per thread; OMP/OPENBLAS/MKL threads "
          f"{os.environ['OMP_NUM_THREADS']}/{os.environ['OPENBLAS_NUM_THREADS']}/"
          f"{os.environ['MKL_NUM_THREADS']}; calls per second (ratio to 1 thread)")
    for name, make in contenders:
        predict, step = make()
        for label, fn in (("forward, no updates", predict), ("training step, updates", step)):
            rates = [throughput(fn, n) for n in THREADS]
            cells = "  ".join(f"{n}t {r:9.0f} ({r / rates[0]:4.2f}x)"
                              for n, r in zip(THREADS, rates))
            print(f"  {name:8s} {label:24s} {cells}")


if __name__ == "__main__":
    main()
