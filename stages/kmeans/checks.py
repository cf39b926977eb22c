"""What status and validate say of the codebook: its line in `status`, and its problems for `validate`."""

from __future__ import annotations

import schemas.codebook as codebook_format
from pipeline import visual_words
from pipeline.engine.lineage import Lineage
from pipeline.engine.records import read_json
from pipeline.engine.workdir import WorkDir


def status_line(checker: Lineage, states_of: dict) -> str:
    state = checker.state("kmeans", verify="size")
    if state.status == "missing":
        return f"{'kmeans':<9} {'not run':>15}"
    # the codebook's record names the features parts it was fit on, not their bytes now: a part that no
    # longer matches its record (corrupt, missing) makes the codebook's input not current either
    behind = sorted(
        (shard, part)
        for shard, part in (states_of.get("features") or {}).items()
        if part.status in ("corrupt", "missing")
    )
    if state.current and behind:
        shard, part = behind[0]
        more = f" (and {len(behind) - 1} more)" if len(behind) > 1 else ""
        return (
            f"{'kmeans':<9} {'stale':>15}  an input is not current: features part {shard:05d} is "
            f"{part.status}{more}: run the features stage, then kmeans"
        )
    if not state.current:
        return f"{'kmeans':<9} {state.status:>15}  {state.reason}"
    info = read_json(checker.work.codebook_sidecar) or {}
    return (
        f"{'kmeans':<9} {'current':>15}  codebook depth {info.get('depth', '?')}, k {info.get('k', '?')}, "
        f"fit on {info.get('sample_size', 0):,} clips"
    )


def validate(work: WorkDir, checker: Lineage) -> list[str]:
    state = checker.state("kmeans", verify=True)
    if state.status == "missing":
        return []
    if not state.current:
        return [f"{work.codebook}: the codebook is {state.status}: {state.reason}"]
    try:
        visual_words.load(work.codebook)
    except codebook_format.CorruptCodebook as problem:
        return [str(problem)]
    return []
