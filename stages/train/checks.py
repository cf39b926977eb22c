"""What validate says of training: the newest checkpoint against the align shards and codebook it names."""

from __future__ import annotations

from pipeline.engine.lineage import InputNotReady, Lineage, explain
from pipeline.engine.records import CorruptFile, read_json
from pipeline.engine.workdir import WorkDir


def validate(work: WorkDir, checker: Lineage) -> list[str]:
    checkpoints = sorted(work.checkpoints.glob("step-*")) if work.checkpoints.exists() else []
    if not checkpoints:
        return []
    latest = checkpoints[-1]
    from videobert.checkpoints import problem_of  # its files against their recorded sha256 first

    damaged = problem_of(latest)
    if damaged:
        return [f"{latest}: {damaged}"]
    try:
        info = read_json(latest / "model.json") or {}
    except CorruptFile as problem:
        return [str(problem)]
    recorded = info.get("lineage")
    if not recorded:
        return [f"{latest}: trained by an earlier version (no lineage): its inputs cannot be checked"]
    try:
        now = checker.expected("train", record={"lineage": recorded})
    except (InputNotReady, CorruptFile) as problem:
        return [f"{latest}: its inputs are not current: {problem}"]
    if recorded != now:
        return [f"{latest}: trained on other inputs than the current ones ({explain(recorded, now)})"]
    return []
