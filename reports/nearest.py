"""The clips nearest a codebook node's centroid, for the pictures of visual words (the gallery, the
report's predicted words and forecasts): a node's members are the clips whose descent
(schemas.codebook.descend, the quantize stage's rule) passes through it, ranked by the L2 distance of their
feature to the node's centroid. The features are streamed shard by shard and each node keeps only its best
clips and the names of (up to VIDEOS_COUNTED of) the videos its clips come from, so memory is bounded by the
number of nodes asked for, not by the collection. Thumbnails are the decode stage's (a clip's middle frame),
read only for the clips shown."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import schemas.codebook as codebook_format
from pipeline import storage, visual_words
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.progress import Progress
from schemas import metadata

READ_BATCH_ROWS = 8_192
VIDEOS_COUNTED = 1_000  # distinct videos named per node (memory: nodes asked for x this); past it: "1,000+"


@dataclass(frozen=True)
class Clip:
    shard: int
    video_id: str
    clip_index: int
    start_s: float
    distance: float  # squared L2 distance of its feature to the node's centroid

    @property
    def order_key(self) -> tuple:
        return self.distance, self.video_id, self.clip_index


@dataclass
class NodeClips:
    """The clips nearest one node's centroid seen so far, and how many clips descended through it."""

    level: int
    node: int
    keep: int
    nearest: list[Clip] = field(default_factory=list)
    clips: int = 0
    videos: set[str] = field(default_factory=set)  # the videos its clips come from, up to VIDEOS_COUNTED

    def offer(self, candidates: list[Clip]) -> None:
        self.nearest = sorted(self.nearest + candidates, key=lambda clip: clip.order_key)[: self.keep]

    def count_videos(self, video_ids: list[str]) -> None:
        for video_id in video_ids:
            if len(self.videos) == VIDEOS_COUNTED:
                return
            self.videos.add(video_id)

    @property
    def only_video(self) -> str | None:
        """The one video all its clips come from, when they all come from one."""
        return next(iter(self.videos)) if len(self.videos) == 1 else None


def feature_parts_checked(work_dir: Path, codebook: codebook_format.Codebook) -> list[tuple[int, Path]]:
    """The completed features parts; refused when their feature space is not the codebook's."""
    parts = Lineage(work_dir).current_parts("features")
    if not parts:
        raise FileNotFoundError(
            f"no current features shards under {WorkDir(work_dir).data_folder('features')}: "
            f"run the features stage first"
        )
    for shard, path in parts:
        footer = storage.parquet_file(path).metadata
        if footer.num_rows:
            codebook_format.check_feature_provenance(
                codebook,
                shard,
                metadata.read(footer.schema.to_arrow_schema()).feature_provenance_hash,
                "its clusters say nothing about these features",
            )
    return parts


def nearest_clips(
    work_dir: Path,
    codebook: codebook_format.Codebook,
    nodes_by_level: dict[int, list[int]],
    per_node: int,
    *,
    quiet: bool = False,
) -> dict[tuple[int, int], NodeClips]:
    """For each (level, node) asked for, its `per_node` member clips nearest its centroid, streaming the
    features shard by shard."""
    found = {
        (level, node): NodeClips(level, node, per_node) for level, nodes in nodes_by_level.items() for node in nodes
    }
    tracked = {level: np.array(sorted(nodes), dtype=np.int64) for level, nodes in nodes_by_level.items() if nodes}
    parts = feature_parts_checked(work_dir, codebook)
    with Progress(total=len(parts), unit="shards", desc="gallery", quiet=quiet) as progress:
        for shard, path in parts:
            clips_in_shard = 0
            for batch in storage.parquet_file(path).iter_batches(
                batch_size=READ_BATCH_ROWS, columns=["video_id", "clip_index", "start_s", "feature"]
            ):
                if not batch.num_rows:
                    continue
                clips_in_shard += batch.num_rows
                vectors = (
                    batch.column(3)
                    .flatten()
                    .to_numpy(zero_copy_only=False)
                    .reshape(batch.num_rows, -1)
                    .astype(np.float32)
                )
                # only as deep as the deepest level shown: the levels below cost most of a descent
                _, path_rows = visual_words.descend(codebook, vectors, return_path=True, levels=max(tracked))
                videos = batch.column(0).dictionary_encode()
                video_codes, video_names = videos.indices.to_numpy(), videos.dictionary.to_pylist()
                for level, level_nodes in tracked.items():
                    column = path_rows[:, level - 1]
                    rows = np.flatnonzero(np.isin(column, level_nodes))
                    if not len(rows):
                        continue
                    members = column[rows]
                    distances = ((vectors[rows] - codebook.centroids[level - 1][members]) ** 2).sum(axis=1)
                    order = np.lexsort((distances, members))  # by node, nearest first
                    nodes, firsts, counts = np.unique(members[order], return_index=True, return_counts=True)
                    for node, first, count in zip(nodes.tolist(), firsts.tolist(), counts.tolist()):
                        entry = found[(level, node)]
                        entry.clips += count
                        entry.count_videos(
                            [
                                video_names[code]
                                for code in np.unique(video_codes[rows[order[first : first + count]]]).tolist()
                            ]
                        )
                        # only the candidates become Python objects, not the whole batch
                        entry.offer(
                            [
                                Clip(
                                    shard,
                                    *(batch.column(c)[int(rows[i])].as_py() for c in range(3)),
                                    float(distances[i]),
                                )
                                for i in order[first : first + min(count, per_node)]
                            ]
                        )
            progress.update(1, clips=clips_in_shard)
    return found


def read_thumbnails(work_dir: Path, clips: list[tuple[int, str, int]]) -> dict[tuple[int, str, int], bytes]:
    """The decode stage's thumbnail of each (shard, video_id, clip_index), read part by part in batches
    (memory: one batch and the thumbnails asked for)."""
    wanted: dict[int, set[tuple[str, int]]] = {}
    for shard, video_id, clip_index in clips:
        wanted.setdefault(shard, set()).add((video_id, clip_index))
    thumbnails = {}
    for shard, keys in sorted(wanted.items()):
        path = WorkDir(work_dir).part("decode", shard)
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: thumbnails come from the decode stage; run it first")
        for batch in storage.parquet_file(path).iter_batches(
            batch_size=READ_BATCH_ROWS, columns=["video_id", "clip_index", "thumbnail_jpeg"]
        ):
            for row, key in enumerate(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())):
                if key in keys:
                    thumbnails[(shard, *key)] = batch.column(2)[row].as_py()
    return thumbnails


def decode_statuses(work_dir: Path, video_ids: set[str]) -> dict[str, str]:
    """The decode status (ok, partial, ...) of each of `video_ids`, from the decode stage's per-video table."""
    statuses: dict[str, str] = {}
    if not video_ids:
        return statuses
    for _, path in Lineage(work_dir).current_parts("decode", "videos"):
        if path.exists():
            table = storage.read_table(path, columns=["video_id", "status"])
            statuses.update(
                (video_id, status)
                for video_id, status in zip(table["video_id"].to_pylist(), table["status"].to_pylist())
                if video_id in video_ids
            )
    return statuses
