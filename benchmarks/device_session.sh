#!/usr/bin/env bash
# Everything the GPU machine is used for (a cold start costs minutes), in two parts that
# each fit one device call:
#   bash benchmarks/device_session.sh tests   # pytest -m gpu, the seeds' programs, a profile
#   bash benchmarks/device_session.sh bench   # gpu_seeds, gpu_speed, cold_compile
# Writes logs under ${OUT:-/tmp/symgpu-device}. Run from the repository root after installing
# PyCUDA (see ../shared/device/README.md).
set -u
part=${1:-all}
out=${OUT:-/tmp/symgpu-device}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
gpu="device=cuda,floatX=float32"
if [ "$part" = tests ] || [ "$part" = all ]; then
  echo "== pytest -m gpu"
  python3 -m pytest -m gpu -q -p no:cacheprovider -rfE 2>&1 | tee "$out/gpu_tests.txt" | tail -25
  echo "== examples on the GPU"
  SYMGPU_FLAGS=$gpu python3 examples/check1.py 2>&1 | tee "$out/examples.txt"
  SYMGPU_FLAGS=$gpu python3 examples/check2.py 2>&1 | tee -a "$out/examples.txt"
  SYMGPU_FLAGS=$gpu TRAINING_STEPS=300 python3 examples/logistic_regression.py 2>&1 | tail -8 | tee -a "$out/examples.txt"
  SYMGPU_FLAGS=$gpu python3 examples/memory_and_variables.py 2>&1 | tee -a "$out/examples.txt"
  echo "== profile of the logistic regression on the GPU"
  SYMGPU_FLAGS=$gpu,profile=True python3 examples/logistic_regression_solution.py 2000 > "$out/logreg_profile.txt" 2>&1
  grep -n "Spent\|Time in\|Total compile" "$out/logreg_profile.txt" | head -12
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  echo "== benchmarks"
  python3 benchmarks/gpu_seeds.py 2>&1 | tee "$out/gpu_seeds.txt"
  python3 benchmarks/gpu_speed.py 2>&1 | tee "$out/gpu_speed.txt"
  python3 benchmarks/cold_compile.py 2>&1 | tee "$out/cold_compile.txt"
fi
