"""Long-range forecasting, as the paper's figure (given a video token, the top three tokens VideoBERT
predicts at later time steps).

For each of `eval.forecast_words` visual words (the most frequent non-empty leaves of the codebook the
model was trained with) and each horizon s of `eval.forecast_steps`, the video-only sentence
`[CLS] v [MASK] x s [SEP]` is fed and the visual word at the last [MASK] (s steps of 1.5 s after v) is
read: its three most probable visual words among the non-empty leaves (an empty leaf has no clip, so no
picture and no meaning) and their probabilities. The masks in between are predicted jointly, not
filled in: each horizon is its own marginal. Float32 forward passes.

Writes DIR/eval/forecast.json; `report` shows each visual word and its forecasts as the clips nearest the
leaves' centroids."""

from __future__ import annotations

import numpy as np
import torch

from pipeline import storage
from pipeline.config import Config
from pipeline.engine.workdir import WorkDir
from videobert.data import EMPTY, assemble
from videobert.evaluate import Evaluator

TOP = 3


def forecast(cfg: Config, work_dir, checkpoint=None) -> dict:
    """forecast.json's content: per visual word, per horizon, the top-3 visual words and probabilities."""
    work_dir = WorkDir(work_dir).root
    ev = Evaluator(cfg, work_dir, checkpoint)
    counts = ev.leaf_counts()
    steps = sorted(set(cfg.eval.forecast_steps))
    if max(steps) + 3 > ev.max_len:
        raise ValueError(f"eval.forecast_steps {max(steps)} leaves no room in {ev.max_len} positions (train.max_len)")
    used = np.flatnonzero(counts > 0)
    order = used[np.argsort(-counts[used], kind="stable")]
    words = [int(leaf) for leaf in order[:cfg.eval.forecast_words]]
    empty = torch.from_numpy(counts == 0).to(ev.device)
    layout = ev.layout
    results = []
    for leaf in words:
        horizons = {}
        for step in steps:
            ids, types = assemble(layout, EMPTY, np.array([leaf] + [0] * step, dtype=np.int64), with_separator=False)
            ids[2:2 + step] = layout.mask_id
            _, logits, _ = ev.forward([(ids, types)], [[1 + step]], float32=True)
            visual = logits[0, layout.visual_offset:layout.visual_sep_id].masked_fill(empty, float("-inf"))
            probs = torch.softmax(visual, dim=-1)
            top = torch.topk(probs, k=min(TOP, int((~empty).sum())))
            horizons[str(step)] = [{"leaf": int(i), "prob": float(p)} for p, i in zip(top.values, top.indices)]
        results.append({"leaf": leaf, "members": int(counts[leaf]), "forecasts": horizons})
    report = {"task": "long-range forecasting (the paper's figure): top-3 visual words s steps after v",
              "input": "[CLS] v [MASK] x s [SEP], read at the last [MASK]; non-empty leaves only",
              "steps": steps, "clip_seconds": "each step is one clip (decode.clip_frames / decode.fps)",
              "words": results, "codebook_sha256": ev.info.get("codebook_sha256"), **ev.provenance()}
    storage.atomic_write_json(WorkDir(work_dir).eval_folder / "forecast.json", report)
    return report
