"""The training steps the GPU benchmarks compile, written once: each takes the library's
`shared` and tensor module and returns (outputs, updates)."""
from __future__ import annotations


def build_logreg(shared, tt, X, Y, w0, b0):
    """The seeds' logistic-regression step (benchmarks/gpu_seeds.py) on shared variables."""
    x, y = shared(X, name="x"), shared(Y, name="y")
    w, b = shared(w0, name="w"), shared(b0, name="b")
    p_1 = 1 / (1 + tt.exp(-tt.dot(x, w) - b))
    prediction = p_1 > 0.5
    xent = -y * tt.log(p_1) - (1 - y) * tt.log(1 - p_1)
    cost = tt.cast(xent.mean(), "float32") + 0.01 * (w ** 2).sum()
    gw, gb = tt.grad(cost, [w, b])
    return [prediction, xent], [(w, w - 0.01 * gw), (b, b - 0.01 * gb)]


def build_mlp(shared, tt, Ws, bs, X, Y):
    """One SGD step of the MLP of benchmarks/gpu_speed.py (ReLU, softmax cross-entropy)."""
    from symgpu.gradient import disconnected_grad
    sW = [shared(W) for W in Ws]
    sb = [shared(b) for b in bs]
    h = shared(X)
    for k in range(len(sW)):
        h = tt.dot(h, sW[k]) + sb[k]
        if k < len(sW) - 1:
            h = tt.maximum(h, 0)
    zmax = disconnected_grad(h.max(axis=1, keepdims=True))
    lse = tt.log(tt.exp(h - zmax).sum(axis=1, keepdims=True)) + zmax
    loss = tt.cast(-(shared(Y) * (h - lse)).sum() / len(X), "float32")
    params = sW + sb
    grads = tt.grad(loss, params)
    return [loss], [(p, p - 0.01 * g) for p, g in zip(params, grads)]


#: the second wave of GPU passes made default (fast_run) once they had passed the GPU suite
#: on an H200: guarded in-place updates, the gradient from the loss's log-softmax, the
#: softmax's row bias, bool dropout masks; random.py and gpu_spellings.py time a contender
#: with them excluded (optimizer_excluding=WAVE2_PASSES)
WAVE2_PASSES = ("gpu_guarded_updates:gpu_nll_grad_log_softmax:gpu_softmax_rows_bias:"
                "gpu_narrow_bool_outputs")


#: the fusion passes made default on 2026-11-28: reduction epilogues
#: (symgpu/gpu/ops/reduce_epilogue.py), the arange-free gather (symgpu/gpu/ops/take_rows.py),
#: the Philox state advanced by the fused draw (symgpu/gpu/ops/random_fusion.py); gpu_speed.py
#: and random.py time a contender with them excluded (optimizer_excluding=KERNEL_FUSION_PASSES)
KERNEL_FUSION_PASSES = "gpu_careduce_epilogue:gpu_take_rows:gpu_philox_advance_fusion"
