#!/usr/bin/env bash
# The GPU checks, run once on a lent GPU machine (the device tool): S3D features throughput (model only
# in bf16, and the stage with decode workers feeding it) and VideoBERT training throughput at BERT-large
# size in bf16. That machine has torch/torchvision/transformers/pyarrow but not PyAV: carry its wheel in
# .whl/ (pip download av --python-version 3.12 ...). Results go to $OUT (or ./gpu-results).
set -u
OUT=${OUT:-gpu-results}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"; } 2>&1 | tee "$OUT/machine.txt"
timeout 240 python3 benchmarks/bench_features.py --device cuda --batch-size 32 --decode-workers 14 \
  --copies 400 --model-batches 30 2>&1 | grep -v WARNING | tee "$OUT/features.txt"
timeout 100 python3 benchmarks/bench_features.py --device cuda --batch-size 128 --decode-workers 0 \
  --copies 1 --model-batches 20 2>&1 | grep -v WARNING | grep -E "model only|device" | tee -a "$OUT/features.txt"
if [ -f benchmarks/bench_train.py ]; then
  timeout 180 python3 benchmarks/bench_train.py --device cuda --preset bert-large 2>&1 | tail -30 | tee "$OUT/train.txt"
fi
