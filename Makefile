# Every target uses the virtual environment in .venv (created by `make install`).
PYTHON_SYSTEM ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/default.yaml
WORK   ?= work
INPUT  ?= samples
ARGS   ?=
STAMP  := $(VENV)/.installed
RUN    := $(PY) -m pipeline

.PHONY: install test demo pipeline samples clean \
        manifest decode features kmeans quantize asr align validate summary train eval codebook-info \
        bench-decode bench-features bench-kmeans bench-asr bench-train bench-scale

install: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON_SYSTEM) >/dev/null || { echo "needs $(PYTHON_SYSTEM)"; exit 1; }
	test -x $(PY) || $(PYTHON_SYSTEM) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,ray,whisper]"
	touch $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q $(ARGS)

# The whole pipeline on the bundled sample (samples/, made by scripts/make_samples.py).
DEMO_WORK ?= work/demo
# then a short VideoBERT run on its shards, the zero-shot report, the gallery and the run report
DEMO_EVAL = --set eval.verbs=samples/zero_shot/verbs.txt --set eval.nouns=samples/zero_shot/nouns.txt \
            --set eval.labels=$(DEMO_WORK)/eval/labels.csv
demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(MAKE) --no-print-directory pipeline CONFIG=configs/demo.yaml WORK=$(DEMO_WORK) INPUT=samples
	HF_HUB_OFFLINE=1 $(RUN) train --config configs/demo.yaml --work-dir $(DEMO_WORK) --resume
	$(PY) scripts/demo_labels.py $(DEMO_WORK)
	HF_HUB_OFFLINE=1 $(RUN) eval zero-shot --config configs/demo.yaml --work-dir $(DEMO_WORK) $(DEMO_EVAL)
	$(RUN) gallery --config configs/demo.yaml --work-dir $(DEMO_WORK) --quiet
	$(RUN) report  --config configs/demo.yaml --work-dir $(DEMO_WORK)

# manifest -> features -> kmeans -> quantize -> asr -> align -> validate, then the summary. The features
# pass reads each video once and also writes the decode stage's outputs (clip index, thumbnails, videos)
pipeline: $(STAMP)
	$(RUN) manifest --config $(CONFIG) --work-dir $(WORK) --input $(INPUT) $(ARGS)
	$(RUN) features --config $(CONFIG) --work-dir $(WORK) $(ARGS)
	$(RUN) kmeans   --config $(CONFIG) --work-dir $(WORK) $(ARGS)
	$(RUN) quantize --config $(CONFIG) --work-dir $(WORK) $(ARGS)
	$(RUN) asr      --config $(CONFIG) --work-dir $(WORK) $(ARGS)
	$(RUN) align    --config $(CONFIG) --work-dir $(WORK) $(ARGS)
	$(RUN) validate $(WORK)
	$(RUN) summary  --config $(CONFIG) --work-dir $(WORK)

manifest: $(STAMP)
	$(RUN) manifest --config $(CONFIG) --work-dir $(WORK) --input $(INPUT) $(ARGS)
decode features kmeans quantize asr align train: $(STAMP)
	$(RUN) $@ --config $(CONFIG) --work-dir $(WORK) $(ARGS)
eval: $(STAMP)
	$(RUN) eval zero-shot --config $(CONFIG) --work-dir $(WORK) $(ARGS)
validate: $(STAMP)
	$(RUN) validate $(WORK)
summary codebook-info: $(STAMP)
	$(RUN) $@ --config $(CONFIG) --work-dir $(WORK)

# Regenerates samples/ and tests/fixtures/speech/ (needs Debian's espeak-ng; the product does not).
samples: $(STAMP)
	$(PY) scripts/make_samples.py

bench-decode: $(STAMP)
	$(PY) benchmarks/bench_decode.py $(ARGS)
bench-features: $(STAMP)
	$(PY) benchmarks/bench_features.py $(ARGS)
bench-kmeans: $(STAMP)
	$(PY) benchmarks/bench_kmeans.py $(ARGS)
bench-asr: $(STAMP)
	$(PY) benchmarks/bench_asr.py $(ARGS)
bench-train: $(STAMP)
	$(PY) benchmarks/bench_train.py $(ARGS)
bench-scale: $(STAMP)
	$(PY) benchmarks/bench_scale.py $(ARGS)

clean:
	rm -rf work .pytest_cache
