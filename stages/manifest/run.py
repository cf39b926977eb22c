"""The manifest stage's run: list the input videos, assign them to shards (pipeline/engine/manifest.py, beside
the reading every stage and the trainer use), and say what changed."""

from __future__ import annotations

from pipeline.contract import CollectionResult, CollectionRun


def _listed(shards: list[int]) -> str:
    return ", ".join(str(shard) for shard in shards[:10]) + (" ..." if len(shards) > 10 else "")


def run_collection(job: CollectionRun) -> CollectionResult:
    from pipeline.engine.manifest import write_manifest

    path, table, changes = write_manifest(
        job.cfg, job.options["input"], job.work_dir, incremental=not job.options["force"], confirm_removal=job.confirm
    )
    shards = len(set(table["shard"].to_pylist()))
    if changes.get("unchanged"):
        return CollectionResult(
            f"{table.num_rows} video(s) in {shards} shard(s), unchanged",
            [f"manifest: unchanged, {table.num_rows} videos in {shards} shard(s) ({path})"],
        )
    line = f"manifest: {table.num_rows} videos in {shards} shard(s) -> {path}"
    if changes["new_videos"] is not None:
        line += f"; {changes['new_videos']} new, {changes['removed_videos']} removed"
    changed = changes["changed_shards"]
    if changed and changes["new_videos"] is not None:
        line += f"; later stages redo shard(s) {_listed(changed)}"
    updated = changes.get("updated_shards") or []
    if updated:
        line += (
            f"; paths or transcripts changed in shard(s) {_listed(updated)} "
            f"(asr redoes those whose transcripts changed)"
        )
    if changes.get("replaced"):
        line += f"; the outputs of the dropped videos' shards moved to {changes['replaced']}"
    return CollectionResult(f"{table.num_rows} video(s) in {shards} shard(s)", [line])
