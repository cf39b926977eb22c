import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "override, key",
    [
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
        ("caption.rows=[s3d, bogus]", "caption.rows[1]"),
        ("caption.heads=3", "caption.hidden"),
        ("caption.test_subsets=[training]", "caption.test_subsets"),
        ("caption.dropout=1", "caption.dropout"),
        ("eval.forecast_steps=[2, 0]", "eval.forecast_steps[1]"),
        ("eval.forecast_words=0", "eval.forecast_words"),
        ("caption.cv_folds=1", "caption.cv_folds"),
        ("caption.cv_grid={depth: [1]}", "caption.cv_grid"),
        ("caption.cv_metric=SPICE", "caption.cv_metric"),
    ],
)
def test_config_mistake_names_the_key_in_one_line(override, key):
    with pytest.raises(ConfigError) as error:
        load_config(REPO / "configs" / "default.yaml", [override])
    message = str(error.value)
    assert key in message
    assert "\n" not in message


def test_a_key_that_moved_is_refused_naming_its_new_place(tmp_path):
    message = "config error: executor.ray_feature_models moved to features.ray_models: give it there"
    with pytest.raises(ConfigError) as error:
        load_config(None, ["executor.ray_feature_models=2"])
    assert str(error.value) == message
    config = tmp_path / "old.yaml"
    config.write_text("executor:\n  ray_feature_models: 2\n")
    with pytest.raises(ConfigError) as error:
        load_config(config)
    assert str(error.value) == message
    assert load_config(None, ["features.ray_models=2"]).features.ray_models == 2


def test_shipped_configs_load_with_the_papers_values():
    default = load_config(REPO / "configs" / "default.yaml")
    assert (default.decode.fps, default.decode.clip_frames) == (20.0, 30)
    assert default.kmeans.k**default.kmeans.depth == 20736
    assert default.align.tokens_per_segment_without_text == 16
    assert default.train.lr == 1e-5
    demo = load_config(REPO / "configs" / "demo.yaml")
    assert demo.features.weights == "random"


def test_overrides_and_section_hashes():
    base = load_config(None)
    changed = load_config(None, ["decode.fps=25", "align.text_languages=[en, de]", "train.lr=1e-3"])
    assert changed.decode.fps == 25.0 and changed.align.text_languages == ["en", "de"]
    assert changed.train.lr == 0.001  # YAML 1.1 reads 1e-3 as a string; a float field takes it
    assert base.section_hash("decode") != changed.section_hash("decode")
    assert base.section_hash("kmeans") == changed.section_hash("kmeans")


def test_cli_stops_at_load_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("decode:\n  fps: 20\n  clip_frame: 30\n")
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "decode", "--config", str(bad), "--work-dir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
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
    assert "executor.ray_resources.decode.num_cpus must be a finite number" in _refused(
        None, [f"executor.ray_resources={{decode: {{num_cpus: {value}}}}}"]
    )


def test_fps_is_bounded_by_what_a_camera_gives(tmp_path):
    # 1e6 fps made 100,000 clips of a 3 s video
    assert _refused(None, ["decode.fps=1e6"]) == "config error: decode.fps must be > 0 and <= 120 (got 1000000.0)"
    config = tmp_path / "config.yaml"
    config.write_text("decode:\n  fps: 1000000\n")
    assert "decode.fps must be > 0 and <= 120" in _refused(config)
    assert load_config(None, ["decode.fps=120"]).decode.fps == 120.0


@pytest.mark.parametrize(
    "override, message",
    [
        ("decode.clip_frames=1025", "decode.clip_frames must be >= 14 and <= 1024"),
        ("decode.min_clip_frames=0", "decode.min_clip_frames must be >= 1 and <= 30"),
        ("decode.min_clip_frames=31", "decode.min_clip_frames must be >= 1 and <= 30"),
        ("decode.resize=4096", "decode.resize must be >= 224 and <= 1024"),
        ("decode.crop=2048", "decode.crop must be >= 224 and <= 1024"),
        ("decode.max_pixels=0", "decode.max_pixels must be >= 1 and <= 268435456"),
        ("decode.max_pixels=1000000000", "decode.max_pixels must be >= 1 and <= 268435456"),
        ("kmeans.k=5000", "kmeans.k must be >= 2 and <= 4096"),
        ("kmeans.depth=0", "kmeans.depth must be >= 1"),
        ("kmeans.depth=10000000000", r"kmeans.k \*\* kmeans.depth must be < 2\*\*31"),  # refused, not computed
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
    ],
)
def test_numbers_that_shape_work_have_stated_bounds(override, message):
    assert re.search(message, _refused(None, [override])), override


def test_depth_has_its_own_bound_below_the_int32_leaf_ids():
    assert "kmeans.depth must be >= 1 and <= 8 (got 9)" in _refused(None, ["kmeans.k=2", "kmeans.depth=9"])
    assert load_config(None, ["kmeans.k=2", "kmeans.depth=8"]).kmeans.depth == 8


@pytest.mark.parametrize(
    "key",
    [
        "features.decode_workers",
        "features.num_threads",
        "decode.decode_threads",
        "kmeans.workers",
        "asr.num_threads",
        "train.num_workers",
        "train.num_threads",
        "executor.workers",
    ],
)
def test_worker_and_thread_counts_are_not_negative(key):
    assert _refused(None, [f"{key}=-1"]) == f"config error: {key} must be >= 0 and <= 1024 (got -1)"
    assert key in _refused(None, [f"{key}=100000"])
    assert load_config(None, [f"{key}=0"])  # 0 leaves the choice to the library or the machine


@pytest.mark.parametrize(
    "override, message",
    [
        ("decode.fps=[1,", "config error: --set decode.fps: the value '[1,' is not valid YAML (line 1, column 4: "),
        ("decode.fps={a: [}", "config error: --set decode.fps: the value '{a: [}' is not valid YAML"),
        ("=5", "config error: --set takes section.key=value"),
        ("decode..fps=5", "config error: --set takes section.key=value"),
        ("decode.fps", "config error: --set takes section.key=value"),
    ],
)
def test_a_broken_override_is_one_line_naming_it(override, message):
    assert _refused(None, [override]).startswith(message)


def test_an_override_through_a_value_is_refused(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("decode:\n  fps: 20\n")
    assert (
        _refused(config, ["decode.fps.x=1"])
        == "config error: --set decode.fps.x: decode.fps is not a section (it holds 20)"
    )
    assert "decode.fps must be a number" in _refused(None, ["decode.fps.x=1"])
    # an empty section ("decode:" with its keys commented out) takes overrides
    config.write_text("decode:\n")
    assert load_config(config, ["decode.fps=25"]).decode.fps == 25.0


@pytest.mark.parametrize(
    "content, message",
    [
        (random.Random(0).randbytes(4096), "is not a YAML text file (byte "),
        (b"decode:\n  fps: 2\x000\n", ":2:9: character U+0000 is not allowed in YAML"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is not a YAML text file"),
        (
            b"- decode\n- kmeans\n",
            "must hold a mapping of sections (decode:, kmeans:, ...) at its top level (got a list)",
        ),
        (b"just words", "must hold a mapping of sections"),
        (b"decode: 0\n", "config error: decode must be a mapping (got 0)"),
    ],
    ids=["random-bytes", "nul-byte", "png", "list", "string", "section-not-a-mapping"],
)
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


@pytest.mark.parametrize(
    "content",
    [
        random.Random(1).randbytes(2048),
        b"decode:\n  fps: [1,\n",
        b"decode:\n  fps: .nan\n",
        b"executor:\n  workers: -4\n",
    ],
    ids=["random-bytes", "syntax", "nan", "negative-workers"],
)
def test_cli_refuses_a_bad_config_with_exit_2_and_one_line(tmp_path, content):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "decode", "--config", str(bad), "--work-dir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
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


def _laughs(levels: int, key: str = "seed") -> str:
    """A "billion laughs": each level a list of nine aliases of the one before, 9**levels values in all."""
    lines = [f"{key}: [&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol],"]
    lines += [f"  &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]," for level in range(1, levels)]
    lines.append(f"  [{', '.join([f'*l{levels - 1}'] * 9)}]]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [6, 40])
def test_a_config_whose_aliases_expand_absurdly_is_refused_in_one_short_line(tmp_path, levels):
    config = tmp_path / "config.yaml"
    config.write_text(_laughs(levels))
    assert config.stat().st_size < 2500  # a few hundred bytes that stand for 9**levels values
    message = _refused(config)
    assert message.startswith(
        f"config error: {config}: the config is more than 1,000,000 characters with its aliases (*name) expanded (seed["
    )
    assert len(message) < 300, len(message)
    one_line = " ".join(_laughs(levels, "x").split())[len("x: ") :]
    assert _refused(None, [f"seed={one_line}"]).startswith(
        "config error: --set seed: the config is more than 1,000,000 characters"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "status", "--config", str(config), "--work-dir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and len(result.stderr) < 300, result.stderr


def test_aliases_of_a_sane_size_still_load(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "eval:\n  rankings: &both [open, closed]\n  subsets: [validation]\n"
        "asr:\n  transcript_roots: &roots [/data/a, /data/b]\n"
        "executor:\n  ray_resources:\n    decode: &one {num_cpus: 1}\n    align: *one\n"
    )
    cfg = load_config(config)
    assert cfg.eval.rankings == ["open", "closed"] and cfg.asr.transcript_roots == ["/data/a", "/data/b"]
    assert cfg.executor.ray_resources["align"] == {"num_cpus": 1}


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("align:\n  text_languages: &l [en, *l]\n")
    assert _refused(config) == (
        f"config error: {config}: align.text_languages[1] is an alias (*name) of a node "
        f"that holds it (line 2): a value without end"
    )


@pytest.mark.parametrize(
    "override, key",
    [
        ("seed=" + "[" * 30 + "1" + "]" * 30, "seed must be an integer (got [[[[...]]]])"),
        ("asr.backend=" + "kaldi" * 2000, "asr.backend must be one of faster-whisper, whisper (got 'kaldikaldi"),
        ("decode.fps=" + "x" * 5000, "decode.fps must be a number (got 'xxxx"),
        ("align.text_languages=" + str(list(range(100_000))), "align.text_languages[0] must be a string (got 0)"),
        ("eval.rankings=[" + "open, " * 20000 + "]", "eval.rankings names a ranking twice (got ['open', 'open'"),
    ],
)
def test_every_value_shown_in_a_message_is_bounded(override, key):
    message = _refused(None, [override])
    assert key in message and len(message) <= 700, (len(message), message[:200])


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("decode:\n  fps: 20\n  crop: 224\n  fps: 25\n")
    assert _refused(config) == f"config error: {config}: key decode.fps at line 2 and line 4: give it once"
    config.write_text("decode:\n  fps: 20\nkmeans:\n  k: 3\n\n\ndecode:\n  crop: 224\n")
    assert _refused(config) == f"config error: {config}: key decode at line 1 and line 7: give it once"
    config.write_text("executor:\n  ray_resources:\n    decode: {num_cpus: 1, num_cpus: 2}\n")
    assert "key executor.ray_resources.decode.num_cpus at line 3 and line 3" in _refused(config)
    # a merge key (<<) is not a duplicate: the mapping's own keys override the merged ones, as YAML says
    config.write_text("decode: {<<: {fps: 20, crop: 224}, fps: 25}\n")
    assert load_config(config).decode.fps == 25.0


@pytest.mark.parametrize("key", ["asr.model", "align.tokenizer", "train.init_checkpoint"])
@pytest.mark.parametrize("value", ["''", "'  '", "'pkg:'"])
def test_a_model_key_must_name_a_model(key, value):
    assert _refused(None, [f"{key}={value}"]).startswith(
        f"config error: {key} must name a model: a hub name, a local path or pkg:<module> (got "
    )


def test_a_device_index_must_be_a_number():
    for key in ("features.device", "train.device"):
        assert (
            _refused(None, [f"{key}=cuda:x"]) == f"config error: {key} must be auto, cpu, cuda or cuda:N (got 'cuda:x')"
        )


def _gpus(monkeypatch, torch_count: int, ctranslate2_count: int | None = None) -> None:
    from pipeline import devices

    counts = {"torch": torch_count, "ctranslate2": torch_count if ctranslate2_count is None else ctranslate2_count}
    monkeypatch.setattr(devices, "cuda_device_count", lambda library="torch": counts[library])


@pytest.mark.parametrize(
    "command, override",
    [
        (["features"], "features.device=cuda:99"),
        (["features"], "features.device=cuda"),
        (["asr"], "asr.device=cuda"),
        (["train"], "train.device=cuda:0"),
        (["eval", "zero-shot"], "train.device=cuda"),
        (["decode"], "decode.device=cuda:1"),
    ],
)
def test_a_gpu_this_machine_lacks_stops_the_command_at_load(tmp_path, capsys, monkeypatch, command, override):
    _gpus(monkeypatch, 0)
    key, value = override.split("=")
    settings = ["--set", override, "--set", "decode.backend=torchcodec"]
    assert cli.main([*command, "--work-dir", str(tmp_path / "w"), *settings]) == 2
    which = " that CTranslate2 (faster-whisper) can use" if key == "asr.device" else ""
    assert (
        capsys.readouterr().err == f"config error: {key}={value}, but this machine has no CUDA GPU{which}: use "
        f"auto or cpu\n"
    )
    assert not (tmp_path / "w").exists()


def test_a_gpu_index_must_be_below_the_number_of_gpus(monkeypatch):
    from pipeline.devices import check_devices

    _gpus(monkeypatch, 2, ctranslate2_count=0)
    check_devices(load_config(None, ["features.device=cuda:1", "train.device=cuda"]), "features")
    check_devices(load_config(None, ["train.device=cuda:1"]), "train")
    with pytest.raises(
        ConfigError,
        match=r"^config error: features.device=cuda:2, but this machine has 2 GPU\(s\): "
        r"cuda:0 to cuda:1$",
    ):
        check_devices(load_config(None, ["features.device=cuda:2"]), "features")
    with pytest.raises(ConfigError, match="^config error: train.device=cuda:7, but this machine has 2 GPU"):
        check_devices(load_config(None, ["train.device=cuda:7"]), "eval")
    # faster-whisper runs on CTranslate2, whose build here sees none; openai-whisper runs on torch
    with pytest.raises(ConfigError, match="asr.device=cuda, but this machine has no CUDA GPU that CTranslate2"):
        check_devices(load_config(None, ["asr.device=cuda"]), "asr")
    check_devices(load_config(None, ["asr.device=cuda", "asr.backend=whisper"]), "asr")
    # decode.device is torchcodec's; the commands that run no model on this machine check nothing
    check_devices(
        load_config(None, ["features.device=cuda:5", "decode.device=cuda:9", "decode.backend=torchcodec"]), "status"
    )
    for command in ("submit", "validate", "summary", "kmeans", "align"):
        check_devices(load_config(None, ["train.device=cuda:5", "features.device=cuda:5", "asr.device=cuda"]), command)


def test_a_gpu_index_on_this_machine(tmp_path, capsys):
    """Without a stand-in: the first index past this machine's GPUs (any index on a machine without CUDA)."""
    import torch

    count = torch.cuda.device_count()
    code = cli.main(["features", "--work-dir", str(tmp_path / "w"), "--set", f"features.device=cuda:{count}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"config error: features.device=cuda:{count}, but this machine has ")
    assert ("no CUDA GPU" in err) == (count == 0), err


def test_a_ray_driver_leaves_the_gpus_to_its_workers(tmp_path, capsys, monkeypatch):
    _gpus(monkeypatch, 0)
    ran = []
    monkeypatch.setattr(cli, "dispatch", lambda args, cfg: ran.append(cfg.features.device) or 0)  # not run here
    (tmp_path / "w").mkdir()
    assert (
        cli.main(["features", "--work-dir", str(tmp_path / "w"), "--executor", "ray", "--set", "features.device=cuda"])
        == 0
    )
    assert ran == ["cuda"]
    assert cli.main(["features", "--work-dir", str(tmp_path / "w"), "--set", "features.device=cuda"]) == 2
    assert ran == ["cuda"]
