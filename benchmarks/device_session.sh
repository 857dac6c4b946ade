#!/usr/bin/env bash
# Everything the GPU machine is used for (a cold start costs minutes), in parts that each fit
# one device call (600 s):
#   bash benchmarks/device_session.sh tests      # pytest -m gpu (about 340 s on an H100), the seeds
#   bash benchmarks/device_session.sh tests 4    # the same in 4 concurrent pytest processes,
#                                                # tests spread by their last seconds (when
#                                                # device time is short; logs gpu_tests.txt,
#                                                # the tests' seconds gpu_test_durations.json)
#   bash benchmarks/device_session.sh issues     # the open issues' rows: the MLP and fused chain
#                                                # (gpu_speed), dropout (random), gpu_spellings
#   bash benchmarks/device_session.sh ab BASE    # call overhead against the checkout at BASE
#                                                # (issue 19: gpu_call_overhead, its layers
#                                                # (gpu_call_parts), cpu_overhead,
#                                                # threads --device cuda)
#   bash benchmarks/device_session.sh breakdown  # kernel_breakdown: every contender's kernels
#   bash benchmarks/device_session.sh half       # issue 34: half.py (every row, about 3 min with
#                                                # torch.compile), attention.py in f16/bf16/f32,
#                                                # attention_variants.py (the tilings)
#   bash benchmarks/device_session.sh library    # issue 33: library_gpu.py, every row
#   bash benchmarks/device_session.sh rnn        # issue 32: rnn.py (the default matrix, about
#                                                # 2 min) and the new-length-per-call probe
#   bash benchmarks/device_session.sh classic    # issue 31: the DeepLearningTutorials under
#                                                # device=cuda (tools/theano_programs.py), against
#                                                # Theano's kept float32 outputs; needs the
#                                                # mirror's code/ carried as .dlt and six as
#                                                # .pydeps (the tool's docstring says how)
#   bash benchmarks/device_session.sh pending    # the quick look at issues 32 and 34 (about
#                                                # 7 min; first, the GPT step's nodes alone:
#                                                # node_times.py): their GPU tests, the
#                                                # GPT step's kernels against JAX's, half.py's
#                                                # MLP and GPT rows, rnn.py's masked rows with
#                                                # scan_to_dnn_rnn on (fixed and new-length),
#                                                # rnn_varlen's per-call and CUPTI view
#   bash benchmarks/device_session.sh multigpu   # issue 35 on nvidia-h200-x2 (about 8 min):
#                                                # the GPUs' links, pytest -m multigpu,
#                                                # multi_gpu.py (the seeds' program, the 1.8x
#                                                # chains), distributed.py under torchrun, the
#                                                # example on the default and the forced
#                                                # network transport; then, in its own call,
#                                                # `tests 16` (shards spread over the GPUs)
#   bash benchmarks/device_session.sh lasagne    # issue 31: Lasagne's own suite under
#                                                # device=cuda (tools/theano_library_suite.py)
#                                                # in 8 processes; needs Lasagne's tree carried
#                                                # as .lasagne and mock in .pydeps
# BASE is a copy of an older tree carried to the machine, e.g. made here with
#   mkdir -p .device-wheels/base && git archive c10bea3 | tar -x -C .device-wheels/base
# Writes logs under ${OUT:-/tmp/symgpu-device}. Run from the repository root after installing
# PyCUDA (see the device notes).
set -u
part=${1:-tests}
out=${OUT:-/tmp/symgpu-device}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
gpu="device=cuda,floatX=float32"
case "$part" in
  tests)
    shards=${2:-1}
    if [ "$shards" -gt 1 ]; then
      echo "== pytest -m gpu in $shards processes"
      python3 benchmarks/shard_tests.py "$shards" "$out"
    else
      echo "== pytest -m gpu"
      python3 -m pytest -m gpu -q -p no:cacheprovider -rfE 2>&1 | tee "$out/gpu_tests.txt" | tail -25
    fi
    echo "== examples on the GPU"
    SYMGPU_FLAGS=$gpu python3 examples/check1.py 2>&1 | tee "$out/examples.txt"
    SYMGPU_FLAGS=$gpu python3 examples/check2.py 2>&1 | tee -a "$out/examples.txt"
    ;;
  issues)
    python3 benchmarks/gpu_speed.py --rows mlp,chain 2>&1 | tee "$out/gpu_speed.txt"
    python3 benchmarks/random.py 2>&1 | tee "$out/random.txt"
    python3 benchmarks/gpu_spellings.py 2>&1 | tee "$out/gpu_spellings.txt"
    ;;
  ab)
    base=${2:?"ab needs the other checkout's path"}
    python3 benchmarks/gpu_call_overhead.py --against "$base" 2>&1 | tee "$out/gpu_call_overhead.txt"
    python3 benchmarks/gpu_call_parts.py --against "$base" 2>&1 | tee "$out/gpu_call_parts.txt"
    python3 benchmarks/cpu_overhead.py --against "$base" 2>&1 | tee "$out/cpu_overhead.txt"
    python3 benchmarks/threads.py --device cuda 2>&1 | tee "$out/threads.txt"
    ;;
  breakdown)
    python3 benchmarks/kernel_breakdown.py 2>&1 | tee "$out/kernels_mlp.txt"
    python3 benchmarks/kernel_breakdown.py --dropout 2>&1 | tee "$out/kernels_dropout.txt"
    python3 benchmarks/kernel_breakdown.py --logreg 2>&1 | tee "$out/kernels_logreg.txt"
    ;;
  half)
    (cd benchmarks && python3 half.py 2>&1 | tee "$out/half.txt")
    python3 benchmarks/attention.py --dtypes float16,bfloat16,float32 2>&1 | tee "$out/attention.txt"
    (cd benchmarks && python3 attention_variants.py 2>&1 | tee "$out/attention_variants.txt")
    ;;
  library)
    python3 benchmarks/library_gpu.py 2>&1 | tee "$out/library_gpu.txt"
    ;;
  rnn)
    (cd benchmarks && python3 rnn.py --device cuda --no-cold 2>&1 | tee "$out/rnn.txt")
    python3 benchmarks/rnn_varlen.py --pair 12 2>&1 | tee "$out/rnn_varlen.txt"
    ;;
  classic)
    PYTHONPATH="$PWD/.pydeps:${PYTHONPATH:-}" python3 tools/theano_programs.py --device cuda \
        --checkout .dlt --jobs 8 --lean --scratch "$out/runs" --timeout 240 \
        --summary "$out/classic_summary.txt" 2>&1 | tee "$out/classic.txt"
    ;;
  pending)
    # the GPT step's memory-bound nodes, each timed alone (session 24: vector depth)
    timeout 120 python3 benchmarks/node_times.py 2>&1 | grep -v Warn \
        | tee "$out/node_times.txt" | tail -40
    python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_gpu_cudnn_rnn.py \
        tests/test_scan_dnn_rnn_match.py tests/test_rnn_lengths.py \
        tests/test_gpu_reduce_cols_tile.py tests/test_gpu_reduce_prologue.py \
        tests/test_gpu_advanced_pairs.py tests/test_gpu_nll_grad.py \
        tests/test_gpu_nll_grad_half_copy.py tests/test_gpu_softmax_rows.py \
        tests/test_gpu_elemwise_group.py \
        tests/test_mixed_precision_gpu.py 2>&1 | tee "$out/pending_tests.txt" | tail -6
    # (session 26: gpu_nll_grad_count's kernels, not yet run on a GPU; the elementwise groups)
    # gpu_reduce_prologue: the bf16 steps' bias-gradient sums reading the half gradient
    timeout 150 python3 benchmarks/gpt_step_runner.py --jax 2>&1 | tee "$out/gpt_runner.txt" \
        | grep -v Warning | tail -45
    (cd benchmarks && timeout 150 python3 half.py --rows mlp,gpt --no-torch-compile 2>&1 \
        | tee "$out/half_pending.txt" | tail -10)
    rows=lstm-masked-last-b16-h128-fixed,lstm-masked-last-b16-h128-var
    rows=$rows,gru-masked-last-b16-h128-fixed,gru-masked-all-b16-h128-var
    rows=$rows,lstm-masked-all-b64-h512-fixed,lstm-unmasked-all-b64-h512-fixed
    (cd benchmarks && SYMGPU_FLAGS=optimizer_including=scan_to_dnn_rnn python3 rnn.py \
        --device cuda --no-cold --skip compile,jax-fp32,cudnn,symgpu --subset "$rows" \
        2>&1 | tee "$out/rnn_dnn_match.txt" | grep -v '^    ' | tail -16)
    SYMGPU_FLAGS=optimizer_including=scan_to_dnn_rnn python3 benchmarks/rnn_varlen.py \
        --calls 8 --profile 4 --tf32 --profile-fixed 2>&1 | tee "$out/rnn_varlen_dnn.txt" \
        | grep 'median\|CUPTI\| us ' | head -30
    ;;
  multigpu)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    n=$(nvidia-smi -L | grep -c '^GPU ')
    nvidia-smi topo -m 2>&1 | tee "$out/topology.txt"
    timeout 150 python3 -m pytest -m multigpu -q -p no:cacheprovider -rfE tests/test_multigpu.py \
        tests/test_distributed_nccl.py 2>&1 | tee "$out/multigpu_tests.txt" | tail -15
    timeout 120 python3 benchmarks/multi_gpu.py 2>&1 | tee "$out/multi_gpu.txt"
    # the issue's rows: all-reduce 1 MB..1 GB, then the steps at per-GPU batches whose
    # computation can hide the all-reduce, over three bucket sizes
    timeout 220 torchrun --nproc_per_node="$n" benchmarks/distributed.py --batch 4096 \
        --lenet-batch 1024 --bucket-mb 25,2,1 2>&1 | grep -v '^W1' | tee "$out/distributed.txt"
    # whether NCCL's registration of captured buffers explains the 4-16 MB gap (session 21)
    NCCL_GRAPH_REGISTER=0 timeout 90 torchrun --nproc_per_node="$n" benchmarks/distributed.py \
        --nets none 2>&1 | grep -v '^W1' | tee -a "$out/distributed.txt"
    for transport in default network; do
      if [ $transport = network ]; then export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; fi
      echo "== examples/data_parallel_mlp.py, $transport transport"
      SYMGPU_FLAGS=floatX=float32 timeout 50 torchrun --nproc_per_node="$n" \
          examples/data_parallel_mlp.py 2>&1 | grep 'loss\|rror' | tee -a "$out/example_transports.txt"
    done
    unset NCCL_P2P_DISABLE NCCL_SHM_DISABLE
    echo "== examples/data_parallel_local.py, one process, a rank per context"
    SYMGPU_FLAGS="contexts=dev0->cuda0;dev1->cuda1,floatX=float32" timeout 60 \
        python3 examples/data_parallel_local.py 2>&1 | tail -4 | tee -a "$out/example_transports.txt"
    ;;
  lasagne)
    python3 tools/theano_library_suite.py --device cuda --jobs 8 --mirror .lasagne \
        --deps .pydeps --timeout 400 --summary "$out/lasagne_cuda.txt" 2>&1 | tail -40
    ;;
  *)
    echo "unknown part $part: tests, issues, ab BASE, breakdown, half, library, rnn, classic," \
         "pending, multigpu or lasagne" >&2
    exit 2
    ;;
esac
