import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))   # media_factory
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def realdata() -> Path:
    """The shared folder of real media; tests that need it skip cleanly where it is absent."""
    folder = Path(os.environ.get("VIDEOBERT_REALDATA", REPO.parent / "shared" / "realdata"))
    if not folder.is_dir():
        pytest.skip(f"real media folder {folder} not present (set VIDEOBERT_REALDATA)")
    return folder
