"""The kmeans stage's run: fit the codebook unless it is current, its subtrees on the command's executor."""

from __future__ import annotations

import json

from pipeline.registry import CollectionResult, CollectionRun


def run(job: CollectionRun) -> CollectionResult:
    from stages import kmeans
    stats = kmeans.run(job.cfg, job.work_dir, job.executor, force=job.options["force"], quiet=job.quiet)
    if stats.get("skipped"):
        return CollectionResult("the codebook is current", [f"kmeans: the codebook is current ({stats['codebook']})"])
    return CollectionResult("codebook fitted", [json.dumps(stats, indent=2, default=str)])
