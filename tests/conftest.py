import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))   # media_factory
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The same math kernels on every x86 CPU: on CPUs with AMX (Intel Sapphire Rapids and later) MKL's int8
# kernels change CTranslate2's Whisper results; the English realdata's words stay the same, but the
# Spanish sample falls into a repetition loop (WER 0.47 against 0.28 with the AVX-512 kernels)
os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX512")


@pytest.fixture(scope="session")
def realdata() -> Path:
    """The shared folder of real media; tests that need it skip cleanly where it is absent."""
    folder = Path(os.environ.get("VIDEOBERT_REALDATA", REPO.parent / "shared" / "realdata"))
    if not folder.is_dir():
        pytest.skip(f"real media folder {folder} not present (set VIDEOBERT_REALDATA)")
    return folder
