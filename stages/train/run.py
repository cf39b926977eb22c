"""The train stage's run: pre-train the bundled VideoBERT (videobert/train.py) on the align shards."""

from __future__ import annotations

import json

from pipeline.contract import CollectionResult, CollectionRun


def run_collection(job: CollectionRun) -> CollectionResult:
    from pipeline.engine.workdir import WorkDir
    from stages.train import check_train
    from videobert import train

    resume, restart = job.options["resume"], job.options["restart"]
    if restart or not any(WorkDir(job.work_dir).checkpoints.glob("*")):  # a resumed run loads its own
        check_train(job.cfg)
    stats = train.train(job.cfg, job.work_dir, resume=resume, restart=restart, quiet=job.quiet)
    return CollectionResult("trained", [json.dumps(stats, indent=2, default=str)])
