"""The workloads of benchmarks/half.py, their sizes and data, written once for every contender.

MLP: 784-1024-1024-10 (ReLU, softmax cross-entropy), batch 512, SGD (gpu_speed.py's step).
LeNet: Theano's tutorial network at batch 128, SGD (convnet.py's step).
LSTM: input 128, hidden 128, batch 16, length 50, the last state into a squared error, SGD
(benchmarks/rnn.py's `lstm-unmasked-last-b16-h128-fixed` row); gates i f o c.
GPT: one pre-norm transformer block, d_model 768, 12 heads, sequence 1024, batch 8, causal
attention, MLP 4x with tanh-GELU, a squared error against a fixed target, AdamW.
All parameters float32 (master weights); the contenders compute in bfloat16 where they put
products and keep losses, reductions and updates in float32.
"""
from __future__ import annotations

import dataclasses

import numpy as np

LR = 0.01
SEED = 7


@dataclasses.dataclass(frozen=True)
class MlpSize:
    layers: tuple = (784, 1024, 1024, 10)
    batch: int = 512


@dataclasses.dataclass(frozen=True)
class LstmSize:
    inp: int = 128
    hidden: int = 128
    batch: int = 16
    length: int = 50


@dataclasses.dataclass(frozen=True)
class GptSize:
    d_model: int = 768
    heads: int = 12
    seq: int = 1024
    batch: int = 8


MLP, LSTM, GPT = MlpSize(), LstmSize(), GptSize()
from convnet import BATCH as LENET_BATCH, SHAPES as LENET_SHAPES  # noqa: E402,F401


def adamw_hyper() -> tuple[float, float, float, float]:
    """(beta1, beta2, eps, weight decay) of every contender's AdamW."""
    return 0.9, 0.999, 1e-8, 0.01


def mlp_data(seed: int = SEED):
    rng = np.random.default_rng(seed)
    Ws, bs = [], []
    for a, b in zip(MLP.layers[:-1], MLP.layers[1:]):
        Ws.append((rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype("float32"))
        bs.append(np.zeros(b, "float32"))
    X = rng.standard_normal((MLP.batch, MLP.layers[0])).astype("float32")
    labels = rng.integers(0, MLP.layers[-1], MLP.batch).astype("int64")
    return Ws, bs, X, labels


def lenet_data(seed: int = SEED):
    """convnet.py's batch and parameters (class labels as int64, the peers' index type)."""
    from convnet import data
    x, y, params = data(seed)
    return x, y.astype("int64"), params


def lstm_data(seed: int = SEED):
    rng = np.random.default_rng(seed)
    h, i = LSTM.hidden, LSTM.inp
    W = (rng.standard_normal((i, 4 * h)) / np.sqrt(i)).astype("float32")
    U = (rng.standard_normal((h, 4 * h)) / np.sqrt(h)).astype("float32")
    b = np.zeros(4 * h, "float32")
    x = rng.standard_normal((LSTM.length, LSTM.batch, i)).astype("float32")
    y = rng.standard_normal((LSTM.batch, h)).astype("float32") * 0.1
    return W, U, b, x, y


def gpt_params(seed: int = SEED):
    """{name: float32 array} of one block, the input batch and the target."""
    rng = np.random.default_rng(seed)
    D = GPT.d_model

    def w(a, b, scale=0.02):
        return (rng.standard_normal((a, b)) * scale).astype("float32")
    P = {"ln1_g": np.ones(D, "float32"), "ln1_b": np.zeros(D, "float32"),
         "w_qkv": w(D, 3 * D), "b_qkv": np.zeros(3 * D, "float32"),
         "w_o": w(D, D), "b_o": np.zeros(D, "float32"),
         "ln2_g": np.ones(D, "float32"), "ln2_b": np.zeros(D, "float32"),
         "w_fc": w(D, 4 * D), "b_fc": np.zeros(4 * D, "float32"),
         "w_proj": w(4 * D, D), "b_proj": np.zeros(D, "float32")}
    x = rng.standard_normal((GPT.batch, GPT.seq, D)).astype("float32")
    y = rng.standard_normal((GPT.batch, GPT.seq, D)).astype("float32")
    return P, x, y


def gpt_flops() -> float:
    """Matrix FLOPs of one forward + backward of the block (3x the forward), causal attention
    counted at half its dense cost: for TFLOP/s figures next to the times."""
    B, S, D = GPT.batch, GPT.seq, GPT.d_model
    proj = 2 * B * S * D * (3 * D + D + 4 * D + 4 * D)
    attn = 2 * 2 * B * S * S * D / 2
    return 3.0 * (proj + attn)
