# Every target uses the virtual environment in .venv (created by `make install`).
PYTHON_SYSTEM ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
# empty: a command uses the config its work dir remembers (the built-in defaults for a new one)
CONFIG ?=
CONFIG_ARG = $(if $(CONFIG),--config $(CONFIG))
WORK   ?= work
INPUT  ?= samples
ARGS   ?=
TORCH_INDEX ?=
STAMP  := $(VENV)/.installed
# the console command `make install` puts in .venv (the same as $(PY) -m pipeline)
RUN    := $(VENV)/bin/videobert

.PHONY: install test test-slow test-all test-cluster docs demo youcook2 pipeline samples clean \
        manifest decode features shots quality dedup kmeans quantize asr align validate summary card status train eval codebook-info \
        bench-decode bench-features bench-kmeans bench-asr bench-train bench-scale bench-lineage bench-gallery \
        bench-learning bench-threads bench-slurm bench-curation bench-growth

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON_SYSTEM) >/dev/null || { echo "needs $(PYTHON_SYSTEM)"; exit 1; }
	test -x $(PY) || $(PYTHON_SYSTEM) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# TORCH_INDEX=https://download.pytorch.org/whl/cpu: PyTorch's CPU builds of the pinned pair (no CUDA libraries)
	$(if $(TORCH_INDEX),$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1 --index-url $(TORCH_INDEX))
	# openai-whisper ships only a source archive whose setup.py needs pkg_resources, which setuptools 81 and
	# later no longer have: it is built here with an older setuptools instead of pip's latest
	$(PY) -m pip install --quiet "setuptools>=68,<81" wheel
	$(PY) -m pip install --quiet --no-build-isolation -c constraints.txt openai-whisper
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,ray,whisper,transnetv2,docs]"
	# the top-level package names (pipeline, stages, ...) are generic: no other installed distribution may own one
	$(PY) -m pipeline.packaging
	touch $(STAMP)

# in parallel, one worker per CPU (tests/conftest.py); ARGS="-n 0" runs them in this one process.
# `make test` is the everyday suite; the tests that run whole stages on media, real models or training runs
# (marker `slow`) are `make test-slow`'s, those that start real schedulers (marker `cluster`) `make
# test-cluster`'s; `make test-all` (and CI) runs the three
PYTEST := HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	$(PY) -m ruff check --quiet .
	$(PY) -m ruff format --check --quiet .
	$(PYTEST) -m "not cluster and not slow" $(ARGS)

test-slow: $(STAMP)
	$(PYTEST) -m "slow and not cluster" $(ARGS)

test-all: test test-slow test-cluster

# the two-node Slurm and the multi-node Ray (tests/test_slurm_cluster.py, tests/test_ray_cluster.py)
test-cluster: $(STAMP)
	$(PYTEST) -m cluster $(ARGS)

# The documentation site (mkdocs.yml) into site/; --strict: a broken link, an unlisted page or a missing anchor
# fails it. Its reference pages are generated from the code as it builds (scripts/docs_reference.py).
# NO_MKDOCS_2_WARNING: the theme's notice about its successor, printed on every build, says nothing of the docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# The whole pipeline on the bundled sample (samples/, made by scripts/make_samples.py).
DEMO_WORK ?= work/demo
# then a short VideoBERT run on its shards (the small-run preset, configs/small.yaml) with two recipes held out
# (samples/recipes/splits.csv), the zero-shot report, the gallery and the run report
DEMO_SET = --set train.validation_videos=0 --set train.splits=samples/recipes/splits.csv \
           --set eval.verbs=samples/zero_shot/verbs.txt --set eval.nouns=samples/zero_shot/nouns.txt \
           --set eval.labels=$(DEMO_WORK)/eval/labels.csv
demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(MAKE) --no-print-directory pipeline CONFIG=configs/demo.yaml WORK=$(DEMO_WORK) INPUT=samples
	HF_HUB_OFFLINE=1 $(RUN) train --config configs/small.yaml --work-dir $(DEMO_WORK) $(DEMO_SET) --resume
	$(PY) scripts/demo_labels.py $(DEMO_WORK)
	HF_HUB_OFFLINE=1 $(RUN) eval zero-shot --config configs/small.yaml --work-dir $(DEMO_WORK) $(DEMO_SET)
	$(RUN) gallery --config configs/small.yaml --work-dir $(DEMO_WORK) $(DEMO_SET) --quiet
	$(RUN) report  --config configs/small.yaml --work-dir $(DEMO_WORK) $(DEMO_SET)

# YouCook II, end to end: the manifest from the annotations file (video ids = YouTube ids), every stage,
# a short training run, verb/noun lists and labels from the captions (POS tagger), zero-shot on the
# annotated validation segments, the supervised S3D linear probe, predicted visual words, forecasts, the report, the
# transformers export (WORK/export) and, last, the captioning table (train on training, score validation).
# Every annotated video is quantized with the one codebook; train leaves out the validation and testing
# videos (train.youcook2_excluded_subsets), so pre-training sees the training videos only.
# Defaults: the bundled annotation sample (samples/youcook2/annotations.json, naming sample videos).
# The real benchmark: make youcook2 YC2_ANNOTATIONS=.../youcookii_annotations_trainval.json \
#                                   YC2_VIDEOS=.../raw_videos YC2_CONFIG=configs/default.yaml YC2_WORK=/data/yc2
YC2_ANNOTATIONS ?= samples/youcook2/annotations.json
YC2_VIDEOS ?= samples
YC2_CONFIG ?= configs/demo.yaml
YC2_WORK ?= work/youcook2
YC2_RUN = --config $(YC2_CONFIG) --work-dir $(YC2_WORK)
YC2_EVAL = --set eval.segments=$(YC2_ANNOTATIONS) --set eval.verbs=$(YC2_WORK)/eval/youcook2/verbs.txt \
           --set eval.nouns=$(YC2_WORK)/eval/youcook2/nouns.txt --set eval.labels=$(YC2_WORK)/eval/youcook2/labels.csv
youcook2: $(STAMP)
	$(RUN) youcook2-manifest $(YC2_RUN) --annotations $(YC2_ANNOTATIONS) --videos $(YC2_VIDEOS) $(ARGS)
	for stage in features kmeans quantize asr align; do \
	  HF_HUB_OFFLINE=1 $(RUN) $$stage $(YC2_RUN) $(ARGS) || exit $$?; done
	$(RUN) validate $(YC2_WORK)
	HF_HUB_OFFLINE=1 $(RUN) train $(YC2_RUN) --resume $(ARGS)
	$(RUN) youcook2-labels $(YC2_RUN) --annotations $(YC2_ANNOTATIONS)
	HF_HUB_OFFLINE=1 $(RUN) eval zero-shot $(YC2_RUN) $(YC2_EVAL) $(ARGS)
	$(RUN) eval linear-probe $(YC2_RUN) $(YC2_EVAL) $(ARGS)
	HF_HUB_OFFLINE=1 $(RUN) eval predict-video $(YC2_RUN) --sentence "chop the onion" \
	  --sentence "pour the sauce over the pasta" $(ARGS)
	HF_HUB_OFFLINE=1 $(RUN) eval forecast $(YC2_RUN) $(ARGS)
	$(RUN) report $(YC2_RUN)
	$(RUN) export --work-dir $(YC2_WORK) $(YC2_WORK)/export
	HF_HUB_OFFLINE=1 $(RUN) eval captioning $(YC2_RUN) $(YC2_EVAL) $(ARGS)

# `videobert run`: manifest -> features -> kmeans -> quantize -> asr -> align -> validate -> summary (the
# summary and the dataset card, WORK/README.md and WORK/dataset.json), each stage skipping what is current.
# The features pass reads each video once and also writes the decode stage's outputs. make's own exit status
# is 2 on any failure; the command's is in make's "Error N" line (run `videobert run` for it as the status).
pipeline: $(STAMP)
	$(RUN) run $(CONFIG_ARG) --work-dir $(WORK) --input $(INPUT) $(ARGS)

manifest: $(STAMP)
	$(RUN) manifest $(CONFIG_ARG) --work-dir $(WORK) --input $(INPUT) $(ARGS)
decode features shots quality dedup kmeans quantize asr align train: $(STAMP)
	$(RUN) $@ $(CONFIG_ARG) --work-dir $(WORK) $(ARGS)
eval: $(STAMP)
	$(RUN) eval zero-shot $(CONFIG_ARG) --work-dir $(WORK) $(ARGS)
validate: $(STAMP)
	$(RUN) validate --work-dir $(WORK)
summary codebook-info: $(STAMP)
	$(RUN) $@ $(CONFIG_ARG) --work-dir $(WORK)
# the dataset card (summary writes it too); where the run stands
card status: $(STAMP)
	$(RUN) $@ --work-dir $(WORK)

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
# known-answer learning: held-out alignment and zero-shot on synthetic shards (and generated media when present)
bench-learning: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_learning.py $(ARGS)
bench-lineage: $(STAMP)
	$(PY) benchmarks/bench_lineage.py $(ARGS)
bench-threads: $(STAMP)
	$(PY) benchmarks/bench_threads.py $(ARGS)
bench-gallery: $(STAMP)
	$(PY) benchmarks/bench_gallery.py $(ARGS)
# shots, quality and dedup beside decoding on the same files; dedup at 1x, 4x and 16x collections
bench-curation: $(STAMP)
	$(PY) benchmarks/bench_curation.py $(ARGS)
# every stage's cost per clip and peak RSS at 1x, 4x and 16x collections, locally and through submit on the
# two-node Slurm (skipped without slurm-wlm and munge), and status/validate/summary/report over hand-made work
# dirs of 25, 100 and 400 shards; the slopes, FAIL where one grows faster than the work, PNGs in docs/growth/
bench-growth: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_growth.py $(ARGS)
# starts a two-node Slurm on this machine (needs slurm-wlm and munge: see .ci/run)
bench-slurm: $(STAMP)
	$(PY) benchmarks/bench_slurm.py $(ARGS)

clean:
	rm -rf work .pytest_cache
