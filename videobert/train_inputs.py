"""What a training run reads: the current align shards of the current codebook, pinned and verified against
their records (`training_inputs`), and of those the shards it trains on (`shards_to_train_on`): YouCook II's
evaluation videos, the held-out validation and test videos, the near-duplicates of the videos trained on
and the videos outside train.subset_videos left out, each written down by rank 0 while the other ranks
wait."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import schemas.codebook as codebook_format
from pipeline import visual_words
from pipeline.config import Config
from pipeline.engine.lineage import InputNotReady, Lineage
from pipeline.engine.records import relative
from pipeline.engine.workdir import WorkDir
from videobert import youcook2
from videobert.data import training_shards
from videobert.data_checks import require_codebook
from videobert.shards import confirm_pins, pin_shards
from videobert.subset import subset_shards
from videobert.validation import split_shards

if TYPE_CHECKING:
    from videobert.session import Session


def training_inputs(cfg: Config, work: WorkDir) -> tuple[dict, codebook_format.Codebook, list[Path]]:
    """(the run's lineage, the codebook, the align shards with segments). Every align shard must be
    current and made from this very codebook: visual rows initialised from one tree and tokens of
    another would train on noise."""
    checker = Lineage(work, cfg)
    codebook_state = checker.state("kmeans", verify=True)
    if not codebook_state.current:
        raise InputNotReady(
            f"train needs a current codebook; it is {codebook_state.status}"
            f"{f' ({codebook_state.reason})' if codebook_state.reason else ''}: run the kmeans stage"
        )
    lineage = checker.expected("train")  # every align shard current, or InputNotReady
    codebook = visual_words.load(work.codebook)
    parts = [work.part("align", shard) for shard in checker.manifest_shards()]
    pinned = pin_shards(parts, work.state / "pinned")  # before verifying: what is verified is what is read
    # checked against their records before training: a flipped bit would become a wrong token for 500k steps
    checksums = {}
    for shard, path in zip(checker.manifest_shards(), parts):
        checker.verified("align", shard, path)
        checksums[path.name] = checker.record("align", shard)["outputs"][relative(work, path)]["sha256"]
    confirm_pins(parts, pinned, checksums)
    require_codebook(
        pinned, codebook.info.get("sha256"), f"{work.codebook} is", InputNotReady, ": run quantize and align again"
    )
    return lineage, codebook, training_shards(pinned)


def shards_to_train_on(s: Session, shards: list[Path]) -> tuple[list[Path], list[Path], list[str], list[str]]:
    """(the shards to train on, the align shards held-out videos are read from, the validation videos, the
    test videos). Each kind of left-out rows is written by rank 0 while the others wait."""
    runtime = s.runtime
    # YouCook II's evaluation videos never reach pre-training (videobert/youcook2.py)
    shards, kept_apart = youcook2.keep_apart(s.cfg, s.work, shards, write=runtime.main, quiet=s.quiet)
    if kept_apart:
        runtime.barrier()
    # train.validation_videos (or train.splits): held-out videos, never trained on (videobert/validation.py);
    # then train.subset_videos: the segments of a seeded subset of the other videos only
    align_shards = shards
    shards, validation_videos, test_videos = split_shards(s.cfg, s.work, shards, write=runtime.main)
    if validation_videos or test_videos:
        runtime.barrier()
    # the dedup stage's groups: one video of each trained on (train.keep_duplicates keeps them all)
    shards, copies_left_out = drop_copies(s, shards)
    if copies_left_out:
        runtime.barrier()
    shards = subset_shards(s.cfg, s.work, shards, write=runtime.main)
    if s.cfg.train.subset_videos:
        runtime.barrier()
    return shards, align_shards, validation_videos, test_videos


def drop_copies(s: Session, shards: list[Path]) -> tuple[list[Path], list[str]]:
    """(the shards to train on, the copies left out): without train.keep_duplicates, the rows of every
    near-duplicate but its group's representative are left out, written to DIR/train/deduplicated/."""
    from videobert.copies import Copies
    from videobert.subset import shard_video_ids, write_video_rows

    if s.cfg.train.keep_duplicates:
        return shards, []
    present = set(shard_video_ids(shards))
    left_out = Copies.read(s.work).not_kept(present)
    if not left_out:
        return shards, []
    kept = write_video_rows(
        shards,
        s.work.train_folder / "deduplicated",
        left_out,
        keep=False,
        source_key="deduplicated_of",
        write=s.runtime.main,
        extra={"keep_duplicates": "false"},
        summary={"copies_left_out": left_out},
    )
    if s.runtime.main and not s.quiet:
        print(
            f"[train] dedup: {len(left_out)} near-duplicate video(s) not trained on, each group trains on its "
            f"representative (train.keep_duplicates: true keeps them)",
            file=sys.stderr,
        )
    return kept, left_out
