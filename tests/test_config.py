import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import cli
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
    assert result.stderr.strip() == "config error: unknown key decode.clip_frame; did you mean decode.clip_frames?"


def _refused(path=None, overrides=()) -> str:
    """The ConfigError message of a refused config, checked to be one line."""
    with pytest.raises(ConfigError) as error:
        load_config(path, list(overrides))
    message = str(error.value)
    assert message.startswith("config error: ") and "\n" not in message, message
    return message


@pytest.mark.parametrize("value", [".nan", "nan", ".inf", "inf", "-.inf", "1e400"])
def test_a_float_must_be_finite(value, tmp_path):
    assert _refused(None, [f"decode.fps={value}"]).startswith("config error: decode.fps must be a finite number")
    config = tmp_path / "config.yaml"
    config.write_text(f"asr:\n  pause_split_s: {value}\n")
    assert _refused(config).startswith("config error: asr.pause_split_s must be a finite number")
    # a mapping of floats too
    assert "executor.ray_resources.decode.num_cpus must be a finite number" in \
        _refused(None, [f"executor.ray_resources={{decode: {{num_cpus: {value}}}}}"])


def test_fps_is_bounded_by_what_a_camera_gives(tmp_path):
    # 1e6 fps made 100,000 clips of a 3 s video
    assert _refused(None, ["decode.fps=1e6"]) == \
        "config error: decode.fps must be > 0 and <= 120 (got 1000000.0)"
    config = tmp_path / "config.yaml"
    config.write_text("decode:\n  fps: 1000000\n")
    assert "decode.fps must be > 0 and <= 120" in _refused(config)
    assert load_config(None, ["decode.fps=120"]).decode.fps == 120.0


@pytest.mark.parametrize("override, message", [
    ("decode.clip_frames=1025", "decode.clip_frames must be >= 14 and <= 1024"),
    ("decode.min_clip_frames=0", "decode.min_clip_frames must be >= 1 and <= 30"),
    ("decode.min_clip_frames=31", "decode.min_clip_frames must be >= 1 and <= 30"),
    ("decode.resize=4096", "decode.resize must be >= 224 and <= 1024"),
    ("decode.crop=2048", "decode.crop must be >= 224 and <= 1024"),
    ("decode.max_pixels=0", "decode.max_pixels must be >= 1 and <= 268435456"),
    ("decode.max_pixels=1000000000", "decode.max_pixels must be >= 1 and <= 268435456"),
    ("kmeans.k=5000", "kmeans.k must be >= 2 and <= 4096"),
    ("kmeans.depth=0", "kmeans.depth must be >= 1"),
    ("kmeans.depth=10000000000", r"kmeans.k \*\* kmeans.depth must be < 2\*\*31"),   # refused, not computed
    ("kmeans.niter=1000000", "kmeans.niter must be > 0 and <= 1000"),
    ("kmeans.nredo=1000", "kmeans.nredo must be > 0 and <= 100"),
    ("kmeans.max_fit_vectors=1000000000", "kmeans.max_fit_vectors must be > 0 and <= 100000000"),
    ("asr.max_sentence_s=0", "asr.max_sentence_s must be > 0 and <= 600"),
    ("asr.pause_split_s=-1", "asr.pause_split_s must be > 0 and <= 60"),
    ("train.lr=0", "train.lr must be > 0 and <= 1"),
    ("train.lr=3", "train.lr must be > 0 and <= 1"),
    ("train.mask_prob=1", "train.mask_prob must be > 0 and < 1"),
    ("train.weight_decay=2", "train.weight_decay must be >= 0 and <= 1"),
    ("train.max_len=100000", "train.max_len must be >= 8 and <= 4096"),
    ("train.seed=-1", "train.seed must be >= 0 and <= 4294967295"),
    ("seed=4294967296", "seed must be >= 0 and <= 4294967295"),
    ("align.row_group_size=0", "align.row_group_size must be > 0"),
    ("shards.videos_per_shard=0", "shards.videos_per_shard must be > 0 and <= 1000000"),
])
def test_numbers_that_shape_work_have_stated_bounds(override, message):
    assert re.search(message, _refused(None, [override])), override


def test_depth_has_its_own_bound_below_the_int32_leaf_ids():
    assert "kmeans.depth must be >= 1 and <= 8 (got 9)" in _refused(None, ["kmeans.k=2", "kmeans.depth=9"])
    assert load_config(None, ["kmeans.k=2", "kmeans.depth=8"]).kmeans.depth == 8


@pytest.mark.parametrize("key", ["features.decode_workers", "features.num_threads", "decode.decode_threads",
                                 "kmeans.workers", "asr.num_threads", "train.num_workers", "train.num_threads",
                                 "executor.workers"])
def test_worker_and_thread_counts_are_not_negative(key):
    assert _refused(None, [f"{key}=-1"]) == f"config error: {key} must be >= 0 and <= 1024 (got -1)"
    assert key in _refused(None, [f"{key}=100000"])
    assert load_config(None, [f"{key}=0"])     # 0 leaves the choice to the library or the machine


@pytest.mark.parametrize("override, message", [
    ("decode.fps=[1,", "config error: --set decode.fps: the value '[1,' is not valid YAML (line 1, column 4: "),
    ("decode.fps={a: [}", "config error: --set decode.fps: the value '{a: [}' is not valid YAML"),
    ("=5", "config error: --set takes section.key=value"),
    ("decode..fps=5", "config error: --set takes section.key=value"),
    ("decode.fps", "config error: --set takes section.key=value"),
])
def test_a_broken_override_is_one_line_naming_it(override, message):
    assert _refused(None, [override]).startswith(message)


def test_an_override_through_a_value_is_refused(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("decode:\n  fps: 20\n")
    assert _refused(config, ["decode.fps.x=1"]) == \
        "config error: --set decode.fps.x: decode.fps is not a section (it holds 20)"
    assert "decode.fps must be a number" in _refused(None, ["decode.fps.x=1"])
    # an empty section ("decode:" with its keys commented out) takes overrides
    config.write_text("decode:\n")
    assert load_config(config, ["decode.fps=25"]).decode.fps == 25.0


@pytest.mark.parametrize("content, message", [
    (random.Random(0).randbytes(4096), "is not a YAML text file (byte "),
    (b"decode:\n  fps: 2\x000\n", ":2:9: character U+0000 is not allowed in YAML"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is not a YAML text file"),
    (b"- decode\n- kmeans\n", "must hold a mapping of sections (decode:, kmeans:, ...) at its top level (got a list)"),
    (b"just words", "must hold a mapping of sections"),
    (b"decode: 0\n", "config error: decode must be a mapping (got 0)"),
], ids=["random-bytes", "nul-byte", "png", "list", "string", "section-not-a-mapping"])
def test_a_config_file_that_is_not_yaml_sections_is_one_line(tmp_path, content, message):
    config = tmp_path / "config.yaml"
    config.write_bytes(content)
    assert message in _refused(config)


def test_a_yaml_syntax_error_keeps_its_file_line_and_column(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("decode:\n  fps: 20\n  clip_frames: [30,\nkmeans:\n  k: 12\n")
    message = _refused(config)
    # the unclosed list runs on until the ':' of "  k: 12"; PyYAML's marks are 0-based, an editor's 1-based
    assert message == f"config error: {config}:5:4: expected ',' or ']', but got ':'"
    assert config.read_text().splitlines()[5 - 1][4 - 1] == ":"
    config.write_text("decode:\n\tfps: 20\n")
    assert _refused(config) == f"config error: {config}:2:1: found character '\\t' that cannot start any token"


@pytest.mark.parametrize("content", [random.Random(1).randbytes(2048), b"decode:\n  fps: [1,\n",
                                     b"decode:\n  fps: .nan\n", b"executor:\n  workers: -4\n"],
                         ids=["random-bytes", "syntax", "nan", "negative-workers"])
def test_cli_refuses_a_bad_config_with_exit_2_and_one_line(tmp_path, content):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "pipeline", "decode", "--config", str(bad),
                             "--work-dir", str(tmp_path / "w")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("config error: "), result.stderr
    assert not (tmp_path / "w").exists()


def test_cli_refuses_a_bad_override_with_exit_2_and_one_line(tmp_path, capsys):
    assert cli.main(["decode", "--work-dir", str(tmp_path / "w"), "--set", "decode.fps=[1,"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: --set decode.fps: ") and err.count("\n") == 1, err
    assert cli.main(["decode", "--work-dir", str(tmp_path / "w"), "--set", "decode.fps=1e6"]) == 2
    assert capsys.readouterr().err == "config error: decode.fps must be > 0 and <= 120 (got 1000000.0)\n"
