"""Long-range forecasting, as the paper's figure (given a video token, the top three tokens VideoBERT
predicts at later time steps).

For each of `eval.forecast_words` visual words (the most frequent non-empty leaves of the codebook the
model was trained with) and each horizon s of `eval.forecast_steps`, the video-only sentence
`[CLS] v [MASK] x s [SEP]` is fed and the visual word at the last [MASK] (s steps of 1.5 s after v) is
read: its three most probable visual words among the non-empty leaves (an empty leaf has no clip, so no
picture and no meaning) and their probabilities. The masks in between are predicted jointly, not
filled in: each horizon is its own marginal. Float32 forward passes.

A position is one visual token, and training subsampled the visual tokens at a random step of 1 to
`train.max_subsample_step` clips: a horizon of s positions is s x 1.5 s (clip_frames / fps) at step 1 and
up to s x 1.5 s x max_subsample_step, and every horizon is labelled with that range (`horizons`).

**A number** (`accuracy`): on held-out videos (the checkpoint's validation videos, and the YouCook II videos
kept out of pre-training), the visual word s positions after a context of up to CONTEXT visual words, at
each subsampling step r the training used: `[CLS] c_1 .. c_n [MASK] x s [SEP]` read at the last [MASK]
(the clip r x s after the context's last), top-1 and top-5 accuracy among the non-empty leaves, beside a
frequency prior (the most frequent visual words of the training videos' clips) and the last context word
repeated. At most MAX_CONTEXTS contexts per (horizon, step), a seeded choice. A forecast that does not
depend on its context (one top-1 word for nearly every context, or the same top-3 for every visual word
of the figure) is said in `notes`.

Writes DIR/eval/forecast.json; `report` shows each visual word and its forecasts as the clips nearest the
leaves' centroids."""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from pipeline import storage
from pipeline.config import Config
from pipeline.engine.workdir import WorkDir
from videobert.data import EMPTY, assemble
from videobert.eval.evaluate import Evaluator

TOP = 3
CONTEXT = 4  # visual words before the forecast position
MAX_CONTEXTS = 512  # per (horizon, subsampling step)
TOP_K = (1, 5)
SAME_SHARE = 0.95  # one top-1 word for this share of the contexts: the forecast ignores its context


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
    words = [int(leaf) for leaf in order[: cfg.eval.forecast_words]]
    empty = torch.from_numpy(counts == 0).to(ev.device)
    layout = ev.layout
    results = []
    for leaf in words:
        horizons = {}
        for step in steps:
            ids, types = assemble(layout, EMPTY, np.array([leaf] + [0] * step, dtype=np.int64), with_separator=False)
            ids[2 : 2 + step] = layout.mask_id
            _, logits, _ = ev.forward([(ids, types)], [[1 + step]], float32=True)
            visual = logits[0, layout.visual_offset : layout.visual_sep_id].masked_fill(empty, float("-inf"))
            probs = torch.softmax(visual, dim=-1)
            top = torch.topk(probs, k=min(TOP, int((~empty).sum())))
            horizons[str(step)] = [{"leaf": int(i), "prob": float(p)} for p, i in zip(top.values, top.indices)]
        results.append({"leaf": leaf, "members": int(counts[leaf]), "forecasts": horizons})
    clip_s = cfg.decode.clip_frames / cfg.decode.fps
    max_rate = int(((ev.info.get("config") or {}).get("train") or {}).get("max_subsample_step", 1))
    horizons = {str(step): horizon_label(step, clip_s, max_rate) for step in steps}
    accuracy, notes = held_out_accuracy(ev, work_dir, steps, max_rate, counts, cfg.seed)
    if (
        len(results) > 1
        and len({json.dumps({h: [t["leaf"] for t in f] for h, f in w["forecasts"].items()}) for w in results}) == 1
    ):
        notes.append(
            f"the forecast does not depend on its context: all {len(results)} visual words of the figure "
            f"get the same top-{TOP} at every horizon"
        )
    report = {
        "task": "long-range forecasting (the paper's figure): top-3 visual words s steps after v",
        "input": "[CLS] v [MASK] x s [SEP], read at the last [MASK]; non-empty leaves only",
        "steps": steps,
        "horizons": horizons,
        "clip_seconds": clip_s,
        "subsample_steps": [1, max_rate],
        "position": f"one visual token: {clip_s:g} s x the subsampling step (training drew 1..{max_rate})",
        "words": results,
        "accuracy": accuracy,
        "notes": notes,
        "codebook_sha256": ev.info.get("codebook_sha256"),
        **ev.provenance(),
    }
    storage.atomic_write_json(WorkDir(work_dir).eval_folder / "forecast.json", report)
    return report


def horizon_label(step: int, clip_s: float, max_rate: int) -> dict:
    """What s positions mean in time, given training's subsampling steps 1..max_rate."""
    low, high = step * clip_s, step * clip_s * max_rate
    text = f"{step} position{'s' if step != 1 else ''} = {low:g} s" + (f" to {high:g} s" if max_rate > 1 else "")
    return {"positions": step, "seconds": [low, high], "label": text}


def held_out_videos(ev: Evaluator, work_dir) -> list[str]:
    """The checkpoint's validation videos and the YouCook II videos kept out of its pre-training."""
    from videobert.youcook2 import KEPT_APART_FOLDER

    videos = set(ev.info.get("validation_videos") or [])
    kept = WorkDir(work_dir).train_folder / KEPT_APART_FOLDER / "videos.json"
    if kept.exists():
        videos |= set(json.loads(kept.read_text()).get("videos_left_out") or [])
    return sorted(videos)


def video_tokens(ev: Evaluator, work_dir) -> dict[str, np.ndarray]:
    """Every quantized video's visual words in clip order (the quantize parts of the model's codebook)."""
    from pipeline.engine.lineage import Lineage
    from videobert.data_checks import require_codebook
    from videobert.eval.youcook2 import video_clips

    parts = [path for _, path in Lineage(WorkDir(work_dir)).current_parts("quantize")]
    require_codebook(parts, ev.info.get("codebook_sha256"), f"{ev.path} was trained with")
    ids = set()
    for path in parts:
        ids |= set(storage.read_table(path, columns=["video_id"])["video_id"].to_pylist())
    return {
        video: clips["token"].astype(np.int64) for video, clips in video_clips(work_dir, "quantize", ids, ["token"])
    }


def contexts(tokens: dict[str, np.ndarray], step: int, rate: int):
    """(context, target) pairs of every held-out video: up to CONTEXT words at `rate` clips apart, and the
    word `step` positions (step x rate clips) after the last."""
    for sequence in tokens.values():
        for last in range(len(sequence) - step * rate):
            first = max(last % rate, last - (CONTEXT - 1) * rate)
            yield sequence[first : last + 1 : rate], int(sequence[last + step * rate])


def held_out_accuracy(ev: Evaluator, work_dir, steps: list[int], max_rate: int, counts: np.ndarray, seed: int):
    """(accuracy per horizon and subsampling step with its priors, notes) on the held-out videos."""
    held_out = held_out_videos(ev, work_dir)
    if not held_out:
        return None, [
            "no held-out videos (train.validation_videos = 0 and no YouCook II videos kept apart): no forecast accuracy"
        ]
    everything = video_tokens(ev, work_dir)
    tokens = {v: everything[v] for v in held_out if v in everything}
    training = [t for v, t in everything.items() if v not in set(held_out)]
    frequency = np.bincount(np.concatenate(training), minlength=len(counts)) if training else counts.copy()
    frequency = np.where(counts > 0, frequency, -1)
    prior = np.argsort(-frequency, kind="stable")[: max(TOP_K)]
    empty = torch.from_numpy(counts == 0).to(ev.device)
    layout, budget = ev.layout, ev.max_len - 2
    rng = np.random.default_rng([seed, 11])
    accuracy, notes, ignoring = {}, [], []
    for step in steps:
        for rate in range(1, max_rate + 1):
            pairs = [(c[-max(1, budget - step) :], t) for c, t in contexts(tokens, step, rate)]
            if len(pairs) > MAX_CONTEXTS:
                pairs = [pairs[i] for i in sorted(rng.permutation(len(pairs))[:MAX_CONTEXTS])]
            if not pairs:
                continue
            hits = {k: 0 for k in TOP_K}
            prior_hits = {k: 0 for k in TOP_K}
            repeat_hits, top1 = 0, []
            for start in range(0, len(pairs), ev.cfg.eval.batch_size):
                batch = pairs[start : start + ev.cfg.eval.batch_size]
                examples, positions = [], []
                for context, _ in batch:
                    ids, types = assemble(
                        layout, EMPTY, np.concatenate([context, np.zeros(step, np.int64)]), with_separator=False
                    )
                    ids[1 + len(context) : 1 + len(context) + step] = layout.mask_id
                    examples.append((ids, types))
                    positions.append([len(context) + step])
                _, logits, _ = ev.forward(examples, positions, float32=True)
                visual = logits[:, layout.visual_offset : layout.visual_sep_id].masked_fill(empty, float("-inf"))
                ranked = torch.topk(visual, k=min(max(TOP_K), int((~empty).sum())), dim=-1).indices.cpu().numpy()
                for (context, target), row in zip(batch, ranked):
                    for k in TOP_K:
                        hits[k] += int(target in row[:k])
                        prior_hits[k] += int(target in prior[:k])
                    repeat_hits += int(target == context[-1])
                    top1.append(int(row[0]))
            n = len(pairs)
            common = max(np.bincount(top1)) / n
            accuracy[f"{step}@{rate}"] = {
                "positions": step,
                "subsample_step": rate,
                "seconds": step * rate * ev.cfg.decode.clip_frames / ev.cfg.decode.fps,
                "contexts": n,
                "videos": len(tokens),
                **{f"top{k}": hits[k] / n for k in TOP_K},
                **{f"frequency_prior_top{k}": prior_hits[k] / n for k in TOP_K},
                "repeat_last_top1": repeat_hits / n,
                "distinct_top1": len(set(top1)),
                "most_common_top1_share": common,
            }
            if n > 1 and common >= SAME_SHARE:
                ignoring.append(f"{step}@{rate} ({common:.0%} of {n})")
    if ignoring:
        notes.append(
            f"the forecast does not depend on its context: one top-1 visual word for at least "
            f"{SAME_SHARE:.0%} of the contexts at {len(ignoring)} of {len(accuracy)} positions@step: "
            f"{', '.join(ignoring)}"
        )
    if not accuracy:
        notes.append(f"the held-out videos ({', '.join(held_out)}) have no clips far enough apart for any horizon")
    return accuracy, notes


def format_accuracy(report: dict) -> str:
    """The accuracy table, horizons labelled in seconds, beside the priors."""
    lines = [f"forecast accuracy on held-out videos (one position = {report['position']}):"]
    if not report.get("accuracy"):
        return "\n".join(lines + [f"note: {note}" for note in report.get("notes", [])])
    lines.append(
        f"{'positions':>9} {'step':>4} {'seconds':>8} {'contexts':>8} {'top1':>6} {'top5':>6} "
        f"{'prior1':>6} {'prior5':>6} {'repeat':>6}"
    )
    for row in report["accuracy"].values():
        lines.append(
            f"{row['positions']:>9} {row['subsample_step']:>4} {row['seconds']:>8g} {row['contexts']:>8} "
            f"{row['top1']:>6.3f} {row['top5']:>6.3f} {row['frequency_prior_top1']:>6.3f} "
            f"{row['frequency_prior_top5']:>6.3f} {row['repeat_last_top1']:>6.3f}"
        )
    return "\n".join(lines + [f"note: {note}" for note in report.get("notes", [])])


def print_accuracy(report: dict) -> None:
    print(format_accuracy(report), file=sys.stderr)
