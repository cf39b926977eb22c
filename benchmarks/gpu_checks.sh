#!/usr/bin/env bash
# The GPU checks, one command on a machine with a GPU, about 8 minutes in all; each check
# writes its lines to $OUT/<name>.txt (or ./gpu-results) and the machine to $OUT/machine.txt:
#   features-pyav        720p decode cost before/after the single pass; S3D alone in bf16 on uint8 batches
#                        from pinned memory (model-only) against the stage with PyAV decode worker processes
#   features-gpudec      model-only against the stage decoding on the GPU (torchcodec, NVDEC)
#   features-gpudec-test the GPU tests: torchcodec on the GPU against PyAV, uint8 frames normalised on the GPU
#   train                VideoBERT at BERT-large size in bf16
# That machine has torch/torchvision/transformers/pyarrow but not PyAV or torchcodec: carry their wheels in
# .whl/ (pip download av torchcodec pytest pluggy iniconfig --no-deps --python-version 3.12
# --only-binary=:all: -d .whl; pytest for the GPU tests, where the machine lacks it). torchcodec loads
# PyAV's FFmpeg through pipeline/media/ffmpeg_libs.py. To add a check: one more `check NAME SECONDS COMMAND`.
set -u
OUT=${OUT:-gpu-results}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# torchcodec finds FFmpeg (PyAV's) in every process started from here
eval "$(python3 -m pipeline.media.ffmpeg_libs 2>/dev/null)" || true
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"; } 2>&1 | tee "$OUT/machine.txt"

check() {   # check NAME SECONDS COMMAND...: run it with a time limit, its output in $OUT/NAME.txt
  local name=$1 seconds=$2; shift 2
  echo "== $name" | tee "$OUT/$name.txt"
  timeout "$seconds" "$@" 2>&1 | grep -v WARNING | tee -a "$OUT/$name.txt"
  echo "(exit ${PIPESTATUS[0]})" | tee -a "$OUT/$name.txt"
}

WORKERS=$(( $(nproc) - 2 ))
# 400 copies of a 10 s 360p clip: 2,800 clips, a few seconds of H200 time, long enough to be steady
check features-pyav 200 python3 benchmarks/bench_features.py --device cuda --batch-size 128 \
  --decode-workers "$WORKERS" --copies 400 --model-batches 30 --rounds 2
check features-gpudec 150 python3 benchmarks/bench_features.py --device cuda --batch-size 128 \
  --decode-backend torchcodec --decode-device cuda --copies 200 --model-batches 30 --skip-decode-cost
check features-gpudec-test 60 python3 -m pytest -q -p no:cacheprovider tests/test_torchcodec.py tests/test_features.py -k "gpu"
if [ -f benchmarks/bench_train.py ]; then
  check train 150 python3 benchmarks/bench_train.py --device cuda --preset bert-large
fi
