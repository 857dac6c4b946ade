"""The classic Theano programs (lisa-lab's DeepLearningTutorials) run unchanged on symgpu.

Each program of the tutorials' ``code/`` folder runs as it is, in a subprocess of its own, with
``theano`` aliased to symgpu (``sys.modules['theano'] = symgpu``, as tools/theano_tutorial.py
does), on a small synthetic data set made in the program's own format (no download: a
deterministic ``mnist.pkl.gz`` of 1000/200/200 examples, the two pickles of ``imdb.pkl``, an
ATIS fold ``atis.fold3.pkl.gz``, piano rolls for rnnrbm), with epochs and sizes reduced through
the program's own function arguments (DRIVERS: which function is called with what). The same
runs under the real Theano 1.0.5 (``/work/shared/tools/theano-oracle.sh``, where it exists),
and the numbers the two print are compared line by line::

    python tools/theano_programs.py                       # every program, symgpu and Theano
    python tools/theano_programs.py mlp dA --show         # some, with both outputs
    python tools/theano_programs.py --device cuda         # symgpu under device=cuda
    python tools/theano_programs.py --no-oracle           # against Theano's kept outputs
    python tools/theano_programs.py --backends symgpu     # symgpu only: does each one run?
    python tools/theano_programs.py --checkout DIR        # another DeepLearningTutorials copy
    python tools/theano_programs.py --save-reference      # keep Theano's outputs in the repo
    python tools/theano_programs.py --outputs DIR         # compare a run made elsewhere

Without Theano (the GPU machine), symgpu's output is compared with Theano's output kept in
tools/theano_programs_reference/ (float64; float32 for ``--device cuda``, Theano's float32 run
on the CPU). Under ``--device cuda`` each program reports how many of its compiled functions
hold GPU ops, and the tool fails where none does. ``--jobs N`` runs programs side by side;
``--lean`` keeps only each run's outputs in ``--scratch``. The programs need ``six`` and SciPy
(and ``perl`` for rnnslu's conlleval.pl).

Numbers are compared where the computation is deterministic: lines that print a time are left
out (TIMING), and a program that samples (MRG_RandomStreams: rbm, DBN, SdA's corruption, dA's
30% corruption, rnnrbm, hmc) draws from symgpu's Philox streams, not Theano's MRG31k3p, so its
sampled numbers differ by design (SAMPLES says which lines). Two support modules stand in
where the programs import what is not installed: ``midi.utils`` (rnnrbm reads MIDI files; ours
are NumPy piano rolls under the ``.mid`` name) and, without Pillow, ``PIL.Image`` (dA, cA and
rbm save filter images; the stand-in writes the array).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
MIRROR = Path("/work/.mirror/lisa-lab+DeepLearningTutorials/repo")
ORACLE = Path("/work/shared/tools/theano-oracle.sh")
#: Theano 1.0.5's outputs (float64 on the CPU; float32, the reference of a device=cuda run),
#: compared with where Theano is not installed (the GPU machine); --save-reference remakes them
REFERENCE = TOOLS / "theano_programs_reference"

#: program -> (module, the call, in Python, with ``DATA`` the data set's path)
DRIVERS: dict[str, tuple[str, str]] = {
    "logistic_sgd": ("logistic_sgd", "sgd_optimization_mnist(n_epochs=3, dataset=DATA, "
                                     "batch_size=100)"),
    "logistic_cg": ("logistic_cg", "cg_optimization_mnist(n_epochs=4, mnist_pkl_gz=DATA)"),
    "mlp": ("mlp", "test_mlp(n_epochs=2, dataset=DATA, batch_size=20, n_hidden=100)"),
    "convolutional_mlp": ("convolutional_mlp", "evaluate_lenet5(n_epochs=1, dataset=DATA, "
                                               "nkerns=[5, 5], batch_size=100)"),
    "dA": ("dA", "test_dA(training_epochs=1, dataset=DATA, batch_size=20, "
                 "output_folder='dA_plots')"),
    "cA": ("cA", "test_cA(training_epochs=1, dataset=DATA, batch_size=20, "
                 "output_folder='cA_plots')"),
    "SdA": ("SdA", "test_SdA(pretraining_epochs=1, training_epochs=1, dataset=DATA, "
                   "batch_size=50)"),
    "DBN": ("DBN", "test_DBN(pretraining_epochs=1, training_epochs=1, dataset=DATA, "
                   "batch_size=50)"),
    "rbm": ("rbm", "test_rbm(training_epochs=1, dataset=DATA, batch_size=20, n_chains=1, "
                   "n_samples=1, n_hidden=20, output_folder='rbm_plots')"),
    "lstm": ("lstm", "train_lstm(max_epochs=2, dim_proj=16, n_words=200, batch_size=16, "
                     "valid_batch_size=32, dispFreq=5, validFreq=10, saveto='', "
                     "use_dropout=False, test_size=60)"),
    "lstm_dropout": ("lstm", "train_lstm(max_epochs=1, dim_proj=16, n_words=200, "
                             "batch_size=16, valid_batch_size=32, dispFreq=5, validFreq=10, "
                             "saveto='', use_dropout=True, test_size=60)"),
    "rnnslu": ("rnnslu", "main({'fold': 3, 'data': 'atis', 'lr': 0.8, "
                         "'verbose': 1, 'decay': True, 'win': 7, 'nhidden': 20, "
                         "'seed': 345, 'emb_dimension': 10, 'nepochs': 4, "
                         "'savemodel': False})"),
    "hmc": ("hmc.test_hmc", "sampler_on_nd_gaussian(HMC_sampler.new_from_shared_positions, "
                            "burnin=100, n_samples=100, dim=5)"),
    "rnnrbm": ("rnnrbm", "test_rnnrbm(batch_size=50, num_epochs=1)"),
}

#: the programs that loop with scan: Theano's C scan does not build on Python 3.11, so the
#: oracle runs them without C (THEANO_ORACLE_SCAN=1); DBN's one-step Gibbs chains compile
#: with C there (no scan node is left)
SCAN_PROGRAMS = {"rbm", "rnnslu", "lstm", "lstm_dropout", "rnnrbm", "hmc"}

#: the programs that initialise weights from numpy.linalg.svd (ortho_weight), whose signs
#: differ between NumPy builds: the child fixes them (_svd_with_fixed_signs) on both sides
SVD_PROGRAMS = {"lstm", "lstm_dropout"}

#: the synthetic MNIST's (train, valid, test) sizes where a program needs others than
#: 1000/200/200 (logistic_cg's minibatch is 600 examples, fixed in its code)
#: (rbm: Theano without C draws MRG numbers in a Python loop, one element at a time: its
#: persistent CD-15 chains over 1000 images would take the oracle most of an hour)
MNIST_SIZES: dict[str, tuple[int, int, int]] = {"logistic_cg": (1200, 600, 600),
                                                "rbm": (200, 50, 50)}

#: (program, --device) -> why Theano 1.0.5 itself fails it (so no reference is kept)
THEANO_FAILS: dict[tuple[str, str], str] = {
    ("logistic_cg", "cuda"): "Theano fails in float32: scipy's fmin_cg hands set_value a "
                             "float64 theta, which Theano's float32 TensorType refuses "
                             "(symgpu casts a float64 array to floatX)",
}

#: program -> why its sampled numbers differ from Theano's, and which lines are sampled
#: (a regular expression; None: every number after the first sampled line)
SAMPLES: dict[str, tuple[str, str | None]] = {
    "dA": ("the 30% corruption run draws its binomial mask", None),
    "SdA": ("pretraining corrupts the input with binomial masks", None),
    "DBN": ("contrastive divergence samples the hidden and visible units", None),
    "rbm": ("persistent contrastive divergence samples the units", None),
    "lstm_dropout": ("dropout masks are drawn", None),
    "hmc": ("the momenta and the Metropolis test are drawn", r"empirical|final|^\s*[\[\d-]"),
    "rnnrbm": ("the Gibbs chains are drawn", None),
}
#: the first line of a program's output whose numbers come from sampling: the n-th line
#: (from 1) that holds the text
SAMPLED_FROM: dict[str, tuple[str, int]] = {
    # dA's first run (no corruption: a binomial mask of p=1) is deterministic, its second
    # (after one training epoch) is not
    "dA": ("Training epoch", 2),
    "SdA": ("Pre-training layer", 1),
    "DBN": ("Pre-training layer", 1),
    "rbm": ("Training epoch", 1),
    "lstm_dropout": ("Epoch ", 1),
    "hmc": ("empirical mean", 1),
    "rnnrbm": ("Epoch", 1),
}

#: lines that print a time or a speed (never compared)
TIMING = re.compile(r"\bsec\b|epochs/sec|ran for|[Tt]raining took|completed in|\d+\.\d+s\b|"
                    r"\d+(\.\d+)?m\b|sec/epochs")
GPU_USE = re.compile(r"^@@ compiled functions: (\d+), with GPU ops: (\d+)", re.M)
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_NP_SCALAR = re.compile(r"np\.\w+\(([^()]*)\)")


# ---------------------------------------------------------------------------------- data
def mnist(path: Path, sizes: tuple[int, int, int] = (1000, 200, 200)) -> None:
    """A deterministic MNIST look-alike in ``mnist.pkl.gz``'s format: (train, valid, test),
    each (float32 images (n, 784) in [0, 1], int64 labels (n,)); ten noisy class prototypes,
    so that the error rates are neither 0 nor chance."""
    import numpy
    rng = numpy.random.RandomState(1234)
    protos = (rng.rand(10, 784) < 0.25) * rng.rand(10, 784)
    sets = []
    for n in sizes:
        y = rng.randint(0, 10, size=n)
        noise = rng.rand(n, 784) * (rng.rand(n, 784) < 0.5)
        x = numpy.clip(0.2 * protos[y] + noise, 0, 1).astype("float32")
        sets.append((x, y.astype("int64")))
    with gzip.open(path, "wb") as f:
        pickle.dump(tuple(sets), f, protocol=2)


def imdb(path: Path) -> None:
    """``imdb.pkl``'s format: two pickles, train then test, each (list of word-id lists,
    list of 0/1 labels); reviews of 5-40 words whose label tilts the word distribution."""
    import numpy
    rng = numpy.random.RandomState(4321)
    with open(path, "wb") as f:
        for n in (400, 100):
            xs, ys = [], []
            for _ in range(n):
                label = int(rng.randint(0, 2))
                length = int(rng.randint(5, 41))
                low = 2 + 100 * label
                words = [int(w) for w in rng.randint(low, low + 150, size=length)]
                xs.append(words)
                ys.append(label)
            pickle.dump((xs, ys), f, protocol=2)


def atis(folder: Path) -> None:
    """``atis.fold3.pkl.gz``'s format: (train, valid, test, dicts); a set is (word-id arrays,
    named-entity arrays, label arrays) per sentence; dicts has 'words2idx' and 'labels2idx'
    (IOB labels, as conlleval.pl reads them)."""
    import numpy
    rng = numpy.random.RandomState(777)
    words = {f"w{i}": i for i in range(60)}
    labels = ["O", "B-city", "I-city", "B-date", "I-date", "B-airline"]
    labels2idx = {name: i for i, name in enumerate(labels)}

    def sentences(n):
        lex, ne, y = [], [], []
        for _ in range(n):
            length = int(rng.randint(4, 12))
            w = rng.randint(0, 60, size=length).astype("int32")
            tags, i = [], 0
            while i < length:   # an entity's label follows from its words: learnable
                kind = int(w[i]) % 4
                if kind == 1 and i + 1 < length:
                    tags += [labels2idx["B-city"], labels2idx["I-city"]]
                    i += 2
                elif kind == 2:
                    tags.append(labels2idx["B-date"])
                    i += 1
                else:
                    tags.append(labels2idx["O"])
                    i += 1
            lex.append(w)
            ne.append(numpy.zeros(length, dtype="int32"))
            y.append(numpy.asarray(tags, dtype="int32"))
        return lex, ne, y

    data = (sentences(200), sentences(30), sentences(30),
            {"words2idx": words, "labels2idx": labels2idx, "tables2idx": {}})
    with gzip.open(folder / "atis.fold3.pkl.gz", "wb") as f:
        pickle.dump(data, f, protocol=2)


def nottingham(folder: Path) -> None:
    """Piano rolls for rnnrbm under ``data/Nottingham/train/*.mid`` (read by the ``midi.utils``
    stand-in): 88 notes (MIDI 21-108), a few melodic lines moving by small steps."""
    import numpy
    rng = numpy.random.RandomState(99)
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(3):
        steps = int(rng.randint(60, 120))
        roll = numpy.zeros((steps, 88), dtype="int8")
        note = int(rng.randint(30, 60))
        for t in range(steps):
            note = int(numpy.clip(note + rng.randint(-2, 3), 20, 70))
            roll[t, note] = roll[t, note - 12] = 1
        with open(folder / f"tune{k}.mid", "wb") as f:
            numpy.save(f, roll)


MIDI_STANDIN = '''"""Stand-in for python-midi's midi.utils (not installable here): the .mid files
of the synthetic data set are NumPy piano rolls."""
import numpy


class midiread(object):
    def __init__(self, filename, r=(21, 109), dt=0.2):
        roll = numpy.load(filename)
        self.piano_roll = roll[:, :r[1] - r[0]]


def midiwrite(filename, piano_roll, r=(21, 109), dt=0.2):
    numpy.save(filename + ".npy", numpy.asarray(piano_roll))
'''

PIL_STANDIN = '''"""Stand-in for Pillow's PIL.Image where Pillow is not installed: the programs
only save their filter images."""
import numpy


class _Image(object):
    def __init__(self, array):
        self.array = numpy.asarray(array)

    def save(self, filename, *args, **kwargs):
        numpy.save(str(filename) + ".npy", self.array)


def fromarray(array, mode=None):
    return _Image(array)
'''


# ------------------------------------------------------------------------------- a child
def _svd_with_fixed_signs(numpy) -> None:
    """numpy.linalg.svd with each singular pair's sign fixed (the largest entry of each
    column of u positive): LAPACK builds pick signs differently, and lstm.py's ortho_weight
    initialises its weights with the u of an SVD, so NumPy 2 (symgpu's side) and NumPy 1.23
    (Theano's) would start from different weights."""
    real = numpy.linalg.svd

    def svd(a, full_matrices=True, compute_uv=True, *args, **kwargs):
        res = real(a, full_matrices, compute_uv, *args, **kwargs)
        if not compute_uv:
            return res
        u, s, vh = res
        k = min(u.shape[-1], vh.shape[-2])
        idx = numpy.argmax(numpy.abs(u[..., :, :k]), axis=-2)
        signs = numpy.sign(numpy.take_along_axis(u[..., :, :k], idx[..., None, :], axis=-2))
        signs[signs == 0] = 1
        u = u.copy()
        vh = vh.copy()
        u[..., :, :k] *= signs
        vh[..., :k, :] *= numpy.swapaxes(signs, -1, -2)
        return u, s, vh

    numpy.linalg.svd = svd


def _count_gpu_functions(symgpu) -> None:
    """Count the functions the program compiles and those whose graph holds GPU ops, and
    print both at exit (``@@`` lines, never compared): under device=cuda, the proof that the
    GPU really ran the program."""
    import atexit
    real = symgpu.function
    seen = {"functions": 0, "on_gpu": 0}

    def function(*args, **kwargs):
        f = real(*args, **kwargs)
        seen["functions"] += 1
        names = {type(node.op).__name__ for node in f.maker.fgraph.apply_nodes}
        seen["on_gpu"] += any(name.startswith("Gpu") for name in names)
        return f

    function.__doc__, function.__wrapped__ = real.__doc__, real
    symgpu.function = function
    atexit.register(lambda: print(f"@@ compiled functions: {seen['functions']}, with GPU ops: "
                                  f"{seen['on_gpu']}", flush=True))


def child(program: str, code: Path, work: Path, backend: str) -> None:
    """Run one program here (this process): make its data in `work`, alias ``theano`` (for
    symgpu), import the program from `code` and call its driver."""
    work.mkdir(parents=True, exist_ok=True)
    support = work / "support"
    (support / "midi").mkdir(parents=True, exist_ok=True)
    (support / "midi" / "__init__.py").write_text("")
    (support / "midi" / "utils.py").write_text(MIDI_STANDIN)
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        (support / "PIL").mkdir(exist_ok=True)
        (support / "PIL" / "__init__.py").write_text("")
        (support / "PIL" / "Image.py").write_text(PIL_STANDIN)
    data = work / "mnist.pkl.gz"
    mnist(data, MNIST_SIZES.get(program, (1000, 200, 200)))
    imdb(work / "imdb.pkl")
    atis(work)
    nottingham(code.parent / "data" / "Nottingham" / "train")
    os.environ["ATISDATA"] = str(work)
    sys.path[:0] = [str(code), str(support)]
    if backend == "symgpu":
        import symgpu
        sys.modules["theano"] = symgpu
        _count_gpu_functions(symgpu)
    import numpy
    numpy.random.seed(0)    # lstm's module seeds again; others seed their own RandomState
    if program in SVD_PROGRAMS:
        _svd_with_fixed_signs(numpy)
    os.chdir(work)
    module_name, call = DRIVERS[program]
    module = __import__(module_name, fromlist=["*"])
    namespace = dict(vars(module), DATA=str(data))
    if program == "hmc":
        namespace["HMC_sampler"] = module.HMC_sampler
    import theano
    print(f"@@ floatX={theano.config.floatX} device={getattr(theano.config, 'device', '?')}",
          flush=True)
    eval(call, namespace)  # noqa: S307 - our own table of driver calls
    sys.stdout.flush()


# ------------------------------------------------------------------------------ comparing
def untimed(output: str) -> str:
    """`output` without the lines (and carriage-return progress lines) that print a time:
    what a kept reference holds."""
    lines = output.replace("\r", "\n").splitlines()
    return "".join(line + "\n" for line in lines if not TIMING.search(line))


def numbers(program: str, output: str) -> tuple[list[tuple[str, list[str]]], int]:
    """The compared lines of `output` (each with its numbers as printed) and the index of
    the first sampled one (len() where none is)."""
    lines = []
    sampled = None
    marker, nth = SAMPLED_FROM.get(program, (None, 0))
    for raw in output.replace("\r", "\n").splitlines():
        if raw.startswith("@@") or TIMING.search(raw) or "The code for file" in raw:
            continue
        line = _NP_SCALAR.sub(r"\1", re.sub(r"<[^<>]* at 0x[0-9a-fA-F]+>", "", raw))
        # names with digits (float64, fold3, ../dA.py, w12) are not numbers
        line = re.sub(r"[A-Za-z_][\w./-]*\d[\w./-]*", "", line)
        found = _NUMBER.findall(line)
        if not found:
            continue
        if sampled is None and marker is not None and marker in raw:
            nth -= 1
            if nth == 0:
                sampled = len(lines)
        lines.append((raw.strip(), found))
    return lines, len(lines) if sampled is None else sampled


def digits(a: str, b: str) -> int:
    """How many significant digits two printed numbers share (17 where they are equal)."""
    if a == b:
        return 17
    x, y = float(a), float(b)
    if x == y:
        return 17
    scale = max(abs(x), abs(y))
    rel = abs(x - y) / scale
    n = 0
    while n < 17 and rel < 0.5 * 10.0 ** -n:
        n += 1
    return n


def compare(program: str, ours: str, theirs: str) -> dict:
    """Line-by-line comparison of the deterministic numbers two runs printed."""
    a, sa = numbers(program, ours)
    b, sb = numbers(program, theirs)
    det_a, det_b = a[:sa], b[:sb]
    result = {"lines": len(det_a), "equal": True, "min_digits": 17, "first_diff": None,
              "sampled_lines": (len(a) - sa, len(b) - sb), "sampled_rel": None}
    pairs = [(x, y) for (_, na), (_, nb) in zip(a[sa:], b[sb:]) if len(na) == len(nb)
             for x, y in zip(na, nb)]
    if pairs and len(a) - sa == len(b) - sb:   # how far apart the sampled numbers land
        result["sampled_rel"] = max(abs(float(x) - float(y)) /
                                    max(abs(float(x)), abs(float(y)), 1e-300)
                                    for x, y in pairs)
    if len(det_a) != len(det_b):
        result.update(equal=False, min_digits=0,
                      first_diff=f"{len(det_a)} lines here, {len(det_b)} in Theano's output")
        return result
    for (la, na), (lb, nb) in zip(det_a, det_b):
        if len(na) != len(nb):
            result.update(equal=False, min_digits=0, first_diff=f"{la!r} vs {lb!r}")
            return result
        for x, y in zip(na, nb):
            d = digits(x, y)
            if x != y:
                result["equal"] = False
                if result["first_diff"] is None:
                    result["first_diff"] = f"{la!r} vs {lb!r}"
            result["min_digits"] = min(result["min_digits"], d)
    return result


# -------------------------------------------------------------------------------- running
def extract(checkout: Path, scratch: Path) -> Path:
    """The tutorials' ``code/`` folder copied into `scratch` (``git archive`` of a git
    checkout, a copy otherwise); returns the copy's ``code`` path."""
    scratch.mkdir(parents=True, exist_ok=True)
    git = checkout / ".git" if (checkout / ".git").exists() else checkout
    if (git / "HEAD").exists() and (git / "objects").exists():
        archive = subprocess.run(["git", f"--git-dir={git}", "archive", "HEAD", "code"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    else:
        shutil.copytree(checkout / "code", scratch / "code")
    return scratch / "code"


def run_one(program: str, checkout: Path, scratch: Path, backend: str, device: str,
            timeout: float, lean: bool = False) -> dict:
    """One program in a subprocess (its own copy of the code, its own data)."""
    place = scratch / f"{program}-{backend}"
    code = extract(checkout, place)
    env = dict(os.environ)
    if backend == "symgpu":
        cmd = [sys.executable]
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in
                                            env.get("PYTHONPATH", "").split(os.pathsep) if p])
        if device == "cuda":
            env["SYMGPU_FLAGS"] = ",".join(filter(None, ["device=cuda", "floatX=float32",
                                                         env.get("SYMGPU_FLAGS", "")]))
    else:
        cmd = ["bash", str(ORACLE), "python"]
        env.pop("PYTHONPATH", None)
        if program in SCAN_PROGRAMS:
            env["THEANO_ORACLE_SCAN"] = "1"   # Theano's C scan does not build on Python 3.11
        if device == "cuda":   # the reference for a float32 run: Theano on the CPU, float32
            env["THEANO_FLAGS"] = ",".join(filter(None, ["floatX=float32",
                                                         env.get("THEANO_FLAGS", "")]))
    cmd += [str(Path(__file__).resolve()), "--child", program, "--code", str(code),
            "--work", str(place / "work"), "--backend", backend]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
            f"\n[timed out after {timeout:.0f} s]"
        rc = -1
    (place / "stdout.txt").write_text(out)
    (place / "stderr.txt").write_text(err)
    (place / "rc.txt").write_text(f"{rc}\n")
    if lean:   # only the outputs stay (a run whose folder travels back from the GPU machine)
        shutil.rmtree(place / "code", ignore_errors=True)
        shutil.rmtree(place / "work", ignore_errors=True)
        shutil.rmtree(place / "data", ignore_errors=True)
    last = [ln for ln in err.strip().splitlines() if ln.strip()]
    return {"rc": rc, "stdout": out, "stderr": err, "seconds": time.monotonic() - start,
            "error": last[-1] if rc != 0 and last else ""}


def _lines(n: int) -> str:
    return f"{n} line" if n == 1 else f"{n} lines"


def _ran(run: dict | None) -> str:
    return "-" if run is None else ("runs" if run["rc"] == 0 else "FAILS")


def table(results: dict[str, dict], oracle: bool, device: str) -> str:
    """The summary: per program, whether each side ran and how their numbers compare."""
    head = (f"DeepLearningTutorials on symgpu (device={device})"
            f"{' against Theano 1.0.5' if oracle else ''} (tools/theano_programs.py)")
    lines = [head, "", f"{'program':<18} {'symgpu':<7} {'Theano':<7} numbers"]
    for program, r in results.items():
        if "cmp" not in r:
            failed = [v["error"] for k, v in r.items() if v["rc"] != 0]
            verdict = failed[0][:220] if failed else "-"
        else:
            c = r["cmp"]
            if c["lines"] == 0 and c["sampled_lines"][0]:
                verdict = f"all {c['sampled_lines'][0]} lines sampled"
            elif c["equal"]:
                verdict = f"equal ({_lines(c['lines'])})"
            elif c["min_digits"]:
                verdict = f"agree to {c['min_digits']} digits ({_lines(c['lines'])})"
            else:
                verdict = f"DIFFER: {c['first_diff']}"[:120]
            if c["sampled_lines"][0] and c["lines"]:
                verdict += f"; then {_lines(c['sampled_lines'][0])} sampled"
            if c["sampled_rel"] is not None:
                verdict += f" (within {100 * c['sampled_rel']:.2g}%)"
            if program in SAMPLES:
                verdict += f" [sampled: {SAMPLES[program][0]}]"
        gpu = GPU_USE.search(r.get("symgpu", {}).get("stdout", ""))
        if device == "cuda" and gpu:
            verdict += f" [GPU ops in {gpu.group(2)} of {gpu.group(1)} functions]"
        lines.append(f"{program:<18} {_ran(r.get('symgpu')):<7} {_ran(r.get('theano')):<7} "
                     f"{verdict}")
    return "\n".join(lines)


def run_program(program: str, args: argparse.Namespace, scratch: Path, oracle: bool) -> dict:
    """Both runs of one program (or the symgpu run and Theano's output from --reference),
    and their comparison."""
    r = {}
    if args.outputs is not None:   # symgpu's outputs of an earlier run (e.g. on the GPU)
        out = args.outputs / f"{program}-symgpu"
        if (out / "stdout.txt").exists():
            rc = (out / "rc.txt").read_text().strip() if (out / "rc.txt").exists() else "0"
            err = (out / "stderr.txt").read_text() if (out / "stderr.txt").exists() else ""
            last = [ln for ln in err.strip().splitlines() if ln.strip()]
            r["symgpu"] = {"rc": int(rc), "stdout": (out / "stdout.txt").read_text(),
                           "stderr": err, "seconds": 0.0,
                           "error": last[-1] if int(rc) and last else ""}
    elif "symgpu" in args.backends:
        r["symgpu"] = run_one(program, args.checkout, scratch, "symgpu", args.device,
                              args.timeout, args.lean)
    if args.reference is not None or (not oracle and "theano" in args.backends):
        ref = (args.reference / f"{program}-theano" / "stdout.txt" if args.reference
               else REFERENCE / ("float32" if args.device == "cuda" else "float64")
               / f"{program}.txt")
        rc_file = ref.with_name("rc.txt")
        rc = int(rc_file.read_text().strip()) if args.reference and rc_file.exists() else 0
        if ref.exists():
            r["theano"] = {"rc": rc, "stdout": ref.read_text(), "stderr": "", "seconds": 0.0,
                           "error": THEANO_FAILS.get((program, args.device), "Theano failed")
                           if rc else ""}
        elif not args.reference and (program, args.device) in THEANO_FAILS:
            r["theano"] = {"rc": 1, "stdout": "", "stderr": "", "seconds": 0.0,
                           "error": THEANO_FAILS[(program, args.device)]}
        elif args.reference:
            r["theano"] = {"rc": 1, "stdout": "", "stderr": "", "seconds": 0.0,
                           "error": f"no reference output {ref}"}
    elif oracle and "theano" in args.backends:
        r["theano"] = run_one(program, args.checkout, scratch, "theano", args.device,
                              args.timeout, args.lean)
        if r["theano"]["rc"] and (program, args.device) in THEANO_FAILS:
            r["theano"]["error"] = THEANO_FAILS[(program, args.device)]
        if args.save_reference and r["theano"]["rc"] == 0:
            folder = REFERENCE / ("float32" if args.device == "cuda" else "float64")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{program}.txt").write_text(untimed(r["theano"]["stdout"]))
    if "symgpu" in r and "theano" in r and r["symgpu"]["rc"] == 0 and r["theano"]["rc"] == 0:
        r["cmp"] = compare(program, r["symgpu"]["stdout"], r["theano"]["stdout"])
    return r


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", nargs="*", help=f"some of {', '.join(DRIVERS)}")
    parser.add_argument("--checkout", type=Path, default=MIRROR,
                        help="a DeepLearningTutorials checkout or git dir (default: the mirror)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="symgpu's device (cuda: floatX=float32, and Theano's reference "
                             "runs on the CPU in float32)")
    parser.add_argument("--no-oracle", action="store_true", help="symgpu only")
    parser.add_argument("--backends", default="symgpu,theano",
                        help="which runs: symgpu,theano (default), symgpu or theano")
    parser.add_argument("--reference", type=Path,
                        help="Theano's outputs from an earlier run's --scratch folder "
                             "(<program>-theano/stdout.txt), where Theano is not installed")
    parser.add_argument("--save-reference", action="store_true",
                        help="keep Theano's outputs as the references (REFERENCE) that a "
                             "machine without Theano compares with")
    parser.add_argument("--outputs", type=Path,
                        help="symgpu's outputs from an earlier run's --scratch folder (a run "
                             "on the GPU machine) instead of running symgpu")
    parser.add_argument("--lean", action="store_true",
                        help="keep only each run's stdout/stderr/exit status in --scratch")
    parser.add_argument("--jobs", type=int, default=1, help="programs run at once")
    parser.add_argument("--show", action="store_true", help="print both outputs")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per program")
    parser.add_argument("--summary", type=Path, help="write the table to this file")
    parser.add_argument("--scratch", type=Path, help="keep the runs here (default: a temp dir)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--code", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.code, args.work, args.backend)
        return 0
    programs = args.programs or list(DRIVERS)
    unknown = [p for p in programs if p not in DRIVERS]
    if unknown:
        parser.error(f"unknown programs {unknown}; known: {', '.join(DRIVERS)}")
    args.backends = set(args.backends.split(","))
    oracle = not args.no_oracle and ORACLE.exists()
    scratch = (args.scratch or Path(tempfile.mkdtemp(prefix="theano-programs-"))).resolve()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {p: pool.submit(run_program, p, args, scratch, oracle) for p in programs}
        results: dict[str, dict] = {}
        for program in programs:
            r = results[program] = futures[program].result()
            status = {k: v["rc"] for k, v in r.items() if k != "cmp"}
            seconds = {k: round(v["seconds"]) for k, v in r.items() if k != "cmp"}
            print(f"{program}: exit {status}, {seconds} s", file=sys.stderr, flush=True)
            if args.show or any(v["rc"] != 0 for k, v in r.items() if k != "cmp"):
                for backend in ("symgpu", "theano"):
                    if backend in r:
                        print(f"----- {program} on {backend} (exit {r[backend]['rc']})")
                        print(r[backend]["stdout"][-4000:])
                        if r[backend]["rc"] != 0:
                            print(r[backend]["stderr"][-4000:])
    text = table(results, "theano" in next(iter(results.values()), {}), args.device)
    print(text)
    if args.summary:
        args.summary.write_text(text + "\n")
    ok = all(r.get("symgpu", {"rc": 0})["rc"] == 0 for r in results.values())
    if args.device == "cuda":   # each program must have run on the GPU, not quietly on the host
        for program, r in results.items():
            gpu = GPU_USE.search(r.get("symgpu", {}).get("stdout", ""))
            if "symgpu" in r and (gpu is None or int(gpu.group(2)) == 0):
                print(f"{program}: no compiled function used the GPU", file=sys.stderr)
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
