"""tools/theano_programs.py: the synthetic data sets are in the programs' formats, the printed
numbers are read and compared as the table says, and a program runs through the alias."""
import gzip
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import theano_programs as tp  # noqa: E402


def test_mnist_is_in_the_tutorials_format(tmp_path):
    path = tmp_path / "mnist.pkl.gz"
    tp.mnist(path, (30, 10, 12))
    with gzip.open(path, "rb") as f:
        sets = pickle.load(f, encoding="latin1")   # as logistic_sgd.load_data reads it
    assert [len(s[1]) for s in sets] == [30, 10, 12]
    for x, y in sets:
        assert x.dtype == np.float32 and x.shape[1] == 784 and 0 <= x.min() <= x.max() <= 1
        assert y.dtype == np.int64 and set(np.unique(y)) <= set(range(10))
    tp.mnist(tmp_path / "again.pkl.gz", (30, 10, 12))   # deterministic
    with gzip.open(tmp_path / "again.pkl.gz", "rb") as f:
        np.testing.assert_array_equal(pickle.load(f)[0][0], sets[0][0])


def test_imdb_and_atis_are_in_the_loaders_formats(tmp_path):
    tp.imdb(tmp_path / "imdb.pkl")
    with open(tmp_path / "imdb.pkl", "rb") as f:
        train, test = pickle.load(f), pickle.load(f)   # two pickles, as imdb.load_data reads
    assert len(train[0]) == len(train[1]) and set(train[1]) == {0, 1}
    assert all(isinstance(w, int) and w >= 2 for s in test[0] for w in s)
    tp.atis(tmp_path)
    with gzip.open(tmp_path / "atis.fold3.pkl.gz", "rb") as f:
        train, valid, test, dicts = pickle.load(f)
    lex, ne, y = train
    assert len(lex) == len(ne) == len(y) and all(len(a) == len(b) for a, b in zip(lex, y))
    assert set(dicts) >= {"words2idx", "labels2idx"}
    labels = set(dicts["labels2idx"])
    assert "O" in labels and all(lab == "O" or lab[:2] in ("B-", "I-") for lab in labels)


def test_numbers_skip_times_and_names_and_read_numpy_scalars():
    out = ("@@ floatX=float64 device=cpu\n"
           "epoch 1, minibatch 10/10, validation error 84.500000 %\n"
           "The code run for 3 epochs, with 223.729930 epochs/sec\n"
           "Training epoch 0, cost  np.float64(418.51045056933066)\n"
           "[learning] epoch 0 >> 100.00% completed in 0.21 (sec) <<\r"
           "loading w12 of fold3 from ../dA.py\n")
    lines, sampled = tp.numbers("mlp", out)
    assert [n for _, n in lines] == [["1", "10", "10", "84.500000"], ["0", "418.51045056933066"]]
    assert sampled == 2


def test_compare_counts_digits_and_leaves_sampled_lines_out():
    ours = "Training epoch 0, cost  418.51045056933066\nTraining epoch 0, cost  433.35\n"
    theirs = "Training epoch 0, cost  418.51045056933066\nTraining epoch 0, cost  433.30\n"
    c = tp.compare("dA", ours, theirs)   # dA's second run samples its corruption
    assert c["equal"] and c["lines"] == 1 and c["sampled_lines"] == (1, 1)
    c = tp.compare("mlp", "cost 1.0000001\n", "cost 1.0000002\n")
    assert not c["equal"] and c["min_digits"] == 7
    c = tp.compare("mlp", "cost 1.0\nerror 2\n", "cost 1.0\n")
    assert not c["equal"] and c["min_digits"] == 0 and "lines" in c["first_diff"]


@pytest.mark.skipif(not (tp.MIRROR / "HEAD").exists() and not (tp.MIRROR / ".git").exists(),
                    reason="the DeepLearningTutorials mirror is not on this machine")
def test_logistic_sgd_runs_unchanged_through_the_alias(tmp_path):
    r = tp.run_one("logistic_sgd", tp.MIRROR, tmp_path, "symgpu", "cpu", timeout=300)
    assert r["rc"] == 0, r["stderr"][-2000:]
    lines, _ = tp.numbers("logistic_sgd", r["stdout"])
    assert any("validation error" in line for line, _ in lines), r["stdout"]
    assert "@@ floatX=float64 device=cpu" in r["stdout"]
    # Theano 1.0.5 printed the same numbers (its output kept in the repository)
    theirs = (tp.REFERENCE / "float64" / "logistic_sgd.txt").read_text()
    c = tp.compare("logistic_sgd", r["stdout"], theirs)
    assert c["equal"] and c["lines"] >= 5, c


@pytest.mark.skipif(not (tp.MIRROR / "HEAD").exists() and not (tp.MIRROR / ".git").exists(),
                    reason="the DeepLearningTutorials mirror is not on this machine")
def test_mlp_and_lenet_training_steps_compile_onto_the_virtual_gpu(tmp_path, monkeypatch,
                                                                    vgpu):
    """The classic programs' own layers (mlp.MLP, convolutional_mlp.LeNetConvPoolLayer,
    logistic_sgd.LogisticRegression), their SGD step compiled as the programs compile it
    (givens slicing shared data): with assert_no_cpu_op=raise every heavy op is a GPU op."""
    import symgpu
    from symgpu.config import config
    code = tp.extract(tp.MIRROR, tmp_path)
    monkeypatch.setitem(sys.modules, "theano", symgpu)
    monkeypatch.syspath_prepend(str(code))
    for name in ("mlp", "logistic_sgd", "convolutional_mlp"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import convolutional_mlp
    import logistic_sgd
    import mlp
    T = symgpu.tensor
    rng = np.random.RandomState(1)
    x, y, i = T.matrix("x"), T.ivector("y"), T.lscalar()
    data = symgpu.shared(np.zeros((100, 784), dtype="float32"))
    labels = T.cast(symgpu.shared(np.zeros(100, dtype="float32")), "int32")
    givens = {x: data[i * 20:(i + 1) * 20], y: labels[i * 20:(i + 1) * 20]}

    def step(cost, params):
        with config.change_flags(assert_no_cpu_op="raise"):
            f = symgpu.function([i], cost, givens=givens,
                                updates=[(p, p - 0.1 * T.grad(cost, p)) for p in params])
        return {type(n.op).__name__ for n in f.maker.fgraph.apply_nodes}

    net = mlp.MLP(rng=rng, input=x, n_in=784, n_hidden=50, n_out=10)
    ops = step(net.negative_log_likelihood(y) + 1e-4 * net.L2_sqr, net.params)
    assert {"GpuGemm", "GpuSoftmaxRows"} <= ops and "Dot22" not in ops, ops
    conv = convolutional_mlp.LeNetConvPoolLayer(rng, input=x.reshape((20, 1, 28, 28)),
                                                image_shape=(20, 1, 28, 28),
                                                filter_shape=(5, 1, 5, 5), poolsize=(2, 2))
    top = logistic_sgd.LogisticRegression(input=conv.output.flatten(2), n_in=5 * 12 * 12,
                                          n_out=10)
    ops = step(top.negative_log_likelihood(y), conv.params + top.params)
    assert {"GpuConv2d", "GpuConv2dGradWeights", "GpuPool", "GpuMaxPoolGrad"} <= ops, ops
