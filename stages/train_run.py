"""The train stage's run: pre-train the bundled VideoBERT (videobert/train.py) on the align shards."""

from __future__ import annotations

import json

from pipeline.registry import CollectionResult, CollectionRun


def run(job: CollectionRun) -> CollectionResult:
    from pipeline import preflight
    from pipeline.engine.workdir import WorkDir
    from videobert import train
    resume, restart = job.options["resume"], job.options["restart"]
    if restart or not any(WorkDir(job.work_dir).checkpoints.glob("*")):   # a resumed run loads its own
        preflight.check_stage(job.cfg, "train")
    stats = train.train(job.cfg, job.work_dir, resume=resume, restart=restart, quiet=job.quiet)
    return CollectionResult("trained", [json.dumps(stats, indent=2, default=str)])
