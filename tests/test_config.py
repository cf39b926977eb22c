import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("override, key", [
    ("decode.fpss=20", "decode.fpss"),
    ("nonsense=1", "nonsense"),
    ("decode.fps=0", "decode.fps"),
    ("decode.fps=-3", "decode.fps"),
    ("decode.fps=fast", "decode.fps"),
    ("decode.clip_frames=13", "decode.clip_frames"),
    ("decode.clip_frames=2.5", "decode.clip_frames"),
    ("kmeans.k=1", "kmeans.k"),
    ("features.weights=imagenet", "features.weights"),
    ("asr.backend=kaldi", "asr.backend"),
    ("align.text_languages=en", "align.text_languages"),
    ("asr.vad=maybe", "asr.vad"),
])
def test_config_mistake_names_the_key_in_one_line(override, key):
    with pytest.raises(ConfigError) as error:
        load_config(REPO / "configs" / "default.yaml", [override])
    message = str(error.value)
    assert key in message
    assert "\n" not in message


def test_shipped_configs_load_with_the_papers_values():
    default = load_config(REPO / "configs" / "default.yaml")
    assert (default.decode.fps, default.decode.clip_frames) == (20.0, 30)
    assert default.kmeans.k ** default.kmeans.depth == 20736
    assert default.align.tokens_per_segment_without_text == 16
    assert default.train.lr == 1e-5
    demo = load_config(REPO / "configs" / "demo.yaml")
    assert demo.features.weights == "random"


def test_overrides_and_section_hashes():
    base = load_config(None)
    changed = load_config(None, ["decode.fps=25", "align.text_languages=[en, de]", "train.lr=1e-3"])
    assert changed.decode.fps == 25.0 and changed.align.text_languages == ["en", "de"]
    assert changed.train.lr == 0.001   # YAML 1.1 reads 1e-3 as a string; a float field takes it
    assert base.section_hash("decode") != changed.section_hash("decode")
    assert base.section_hash("kmeans") == changed.section_hash("kmeans")


def test_cli_stops_at_load_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("decode:\n  fps: 20\n  clip_frame: 30\n")
    result = subprocess.run([sys.executable, "-m", "pipeline", "decode", "--config", str(bad),
                             "--work-dir", str(tmp_path / "w")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert result.stderr.strip() == "config error: unknown key decode.clip_frame"
