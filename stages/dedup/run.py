"""dedup: near-duplicate videos grouped, never by comparing all pairs.

1. Signatures, shard by shard: the 64-bit perceptual hashes of each video's hashed frames (three a clip,
   every half second: the decode stage's clip index) with their times, for its usable clips (not flagged
   `dedup.ignore_flags` by the quality stage). 36 bytes a clip stay in memory: 2 GB for the paper's 56
   million clips.
2. Candidates: each video's `dedup.neighbours` nearest videos by the mean of its clips' hash bits (a
   64-d vector: a copy keeps most clips, so most bits' means), from a faiss HNSW graph, built in one thread
   so that it is the same every run: n log n to build and to search.
3. Verification, on the executor (`--workers`, Ray): two videos are copies when at least
   `min_matched_share` of the shorter one's hashed frames (and `min_matched_frames`) have a hashed frame of
   the other within `max_hash_distance` bits at one time offset (within the half second between hashed
   frames: a trimmed copy's grid starts at another phase). Different videos that share pictures (the bundled
   recipes repeat steps, in other orders) match at several offsets, some frames at each.
4. Groups: the copies' connected components; each group's representative is the video training keeps:
   the most clips, then the most pixels, then the smallest video id. Each other member names the video it
   was found a copy of on the way from the representative (`matched_to`), with the share and offset.

Cost: n log n for the graph, n x neighbours comparisons, each within the two videos' clips; measured at
1x, 4x and 16x collections by `make bench-curation`."""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

import schemas
from pipeline import storage
from pipeline.config import Config
from pipeline.contract import CollectionResult, CollectionRun
from pipeline.engine import lineage
from pipeline.engine.workdir import WorkDir
from schemas.metadata import Provenance

log = logging.getLogger("pipeline.dedup")

POPCOUNT = np.array([bin(value).count("1") for value in range(256)], dtype=np.uint8)
HNSW_LINKS = 16  # faiss IndexHNSWFlat's M: graph neighbours per node
PAIRS_PER_TASK = 512
ROWS_PER_BLOCK = 512  # the clips of the shorter video compared at once: memory stays bounded for long videos


@dataclass
class Signature:
    video_id: str
    times: np.ndarray  # float32 times of the hashed frames of its usable clips
    hashes: np.ndarray  # uint64 perceptual hashes of those frames
    clips: int  # all its clips
    pixels: int  # width x height of its picture (0 unknown)

    def descriptor(self) -> np.ndarray:
        """The mean of each of the 64 hash bits over its usable clips."""
        bits = np.unpackbits(self.hashes.view(np.uint8).reshape(-1, 8), axis=1)
        return bits.mean(axis=0).astype(np.float32)


def read_signatures(cfg: Config, work: WorkDir, checker: lineage.Lineage) -> list[Signature]:
    """Every video's signature, shard by shard (each part checked against its record), in video id order."""
    ignored = set(cfg.dedup.ignore_flags)
    fps = cfg.decode.fps
    found = []
    for shard in checker.manifest_shards():
        clips = storage.read_table(
            checker.verified("decode", shard, work.part("decode", shard)),
            columns=["video_id", "clip_index", "start_s", "n_real_frames", "phashes"],
        )
        flags = storage.read_table(
            checker.verified("quality", shard, work.part("quality", shard)), columns=["video_id", "clip_index", "flags"]
        )
        videos = storage.read_table(
            checker.verified("decode", shard, work.part("decode", shard, "videos")),
            columns=["video_id", "width", "height"],
        ).to_pylist()
        unusable = {
            (row["video_id"], row["clip_index"])
            for row in flags.to_pylist()
            if any(flag["reason"] in ignored for flag in row["flags"])
        }
        by_video: dict[str, list[tuple]] = {}
        for video_id, clip_index, start_s, n_real, phashes in zip(
            *(clips[name].to_pylist() for name in ("video_id", "clip_index", "start_s", "n_real_frames", "phashes"))
        ):
            hashed = [(start_s + int(share * n_real) / fps, phash) for share, phash in zip(schemas.HASHED_AT, phashes)]
            by_video.setdefault(video_id, []).append((clip_index, hashed, (video_id, clip_index) in unusable))
        for video in videos:
            rows = sorted(by_video.get(video["video_id"], []), key=lambda row: row[0])
            usable = [point for _, hashed, skip in rows if not skip for point in hashed]
            found.append(
                Signature(
                    video["video_id"],
                    np.array([start for start, _ in usable], dtype=np.float32),
                    np.array([phash for _, phash in usable], dtype=np.int64).view(np.uint64),
                    len(rows),
                    (video["width"] or 0) * (video["height"] or 0),
                )
            )
    return sorted(found, key=lambda signature: signature.video_id)


def candidate_pairs(descriptors: np.ndarray, neighbours: int) -> list[tuple[int, int]]:
    """(i, j), i < j: each row's `neighbours` nearest other rows, from an HNSW graph (all pairs when there
    are no more rows than that)."""
    count = len(descriptors)
    if count <= neighbours + 1:
        return [(i, j) for i in range(count) for j in range(i + 1, count)]
    import faiss

    index = faiss.IndexHNSWFlat(descriptors.shape[1], HNSW_LINKS)
    index.hnsw.efSearch = max(64, 2 * neighbours)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # a graph built in parallel depends on the threads' timing
    try:
        index.add(descriptors)
    finally:
        faiss.omp_set_num_threads(threads)
    _, nearest = index.search(descriptors, neighbours + 1)
    pairs = set()
    for i, row in enumerate(nearest):  # among ties (copies) a row need not find itself first
        for j in [int(j) for j in row if 0 <= j != i][:neighbours]:
            pairs.add((min(i, j), max(i, j)))
    return sorted(pairs)


def match(a_times, a_hashes, b_times, b_hashes, max_distance: int, step_s: float) -> tuple[int, float]:
    """(hashed frames of A matched at the best time offset, that offset: B's times minus A's): a frame of A
    matches when one of B is within `max_distance` bits; offsets within `step_s` (the time between hashed
    frames) of each other are one offset."""
    rows, offsets = [], []
    for start in range(0, len(a_hashes), ROWS_PER_BLOCK):
        block = np.bitwise_xor(a_hashes[start : start + ROWS_PER_BLOCK, None], b_hashes[None, :])
        distances = POPCOUNT[block.view(np.uint8)].reshape(*block.shape, 8).sum(axis=-1, dtype=np.int32)
        i, j = np.nonzero(distances <= max_distance)
        rows.append(i + start)
        offsets.append(b_times[j] - a_times[i + start])
    rows, offsets = np.concatenate(rows), np.concatenate(offsets)
    if not len(rows):
        return 0, 0.0
    bins = np.floor(offsets / step_s).astype(np.int64)
    best, best_offset = 0, 0.0
    for value in np.unique(bins):
        chosen = (bins == value) | (bins == value + 1)
        matched = len(np.unique(rows[chosen]))
        if matched > best:
            best, best_offset = matched, float(np.median(offsets[chosen]))
    return best, best_offset


def compare(task: list[tuple], *, max_distance: int, step_s: float) -> list[tuple[int, int, int, float]]:
    """One executor task: (i, j, frames matched, offset) for each (i, j, A's times, A's hashes, B's ...),
    A the video with fewer hashed frames."""
    return [(i, j, *match(at, ah, bt, bh, max_distance, step_s)) for i, j, at, ah, bt, bh in task]


def verified_pairs(cfg: Config, signatures: list[Signature], pairs: list[tuple[int, int]], executor) -> list[tuple]:
    """(i, j, share, offset_s) of the pairs that are copies: offset_s is where i's clips sit in j's."""
    d = cfg.dedup
    tasks, task = [], []
    for i, j in pairs:
        a, b = (i, j) if len(signatures[i].hashes) <= len(signatures[j].hashes) else (j, i)
        task.append((a, b, signatures[a].times, signatures[a].hashes, signatures[b].times, signatures[b].hashes))
        if len(task) == PAIRS_PER_TASK:
            tasks.append(task)
            task = []
    if task:
        tasks.append(task)
    step_s = cfg.decode.clip_frames / cfg.decode.fps / len(schemas.HASHED_AT)
    work = functools.partial(compare, max_distance=d.max_hash_distance, step_s=step_s)
    results = executor.map(work, tasks, role="dedup") if executor is not None and len(tasks) > 1 else map(work, tasks)
    copies = []
    for result in results:
        for a, b, matched, offset in result:
            share = matched / max(len(signatures[a].hashes), 1)
            if matched >= d.min_matched_frames and share >= d.min_matched_share:
                i, j = sorted((a, b))
                copies.append((i, j, round(share, 4), round(offset if a == i else -offset, 3)))
    return sorted(copies)


def groups(signatures: list[Signature], copies: list[tuple]) -> list[dict]:
    """The group table's rows: each connected component of the copies, its representative first."""
    parent = list(range(len(signatures)))

    def root(node: int) -> int:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    edges: dict[int, list[tuple[int, float, float]]] = {}
    for i, j, share, offset in copies:
        parent[max(root(i), root(j))] = min(root(i), root(j))
        edges.setdefault(i, []).append((j, share, offset))  # offset: where i's clips sit in j's
        edges.setdefault(j, []).append((i, share, -offset))
    members: dict[int, list[int]] = {}
    for node in edges:
        members.setdefault(root(node), []).append(node)

    def rank(node: int):
        signature = signatures[node]
        return (-signature.clips, -signature.pixels, signature.video_id)

    representatives = sorted((min(nodes, key=rank) for nodes in members.values()), key=lambda n: signatures[n].video_id)
    rows = []
    for group_id, first in enumerate(representatives):
        name = signatures[first].video_id
        rows.append(
            {
                "video_id": name,
                "group_id": group_id,
                "representative": name,
                "matched_to": None,
                "matched_share": None,
                "offset_s": None,
            }
        )
        seen, queue = {first}, [first]
        while queue:  # breadth first from the representative: each member names its way there
            node = queue.pop(0)
            for other, share, offset in sorted(edges[node], key=lambda e: (-e[1], signatures[e[0]].video_id)):
                if other in seen:
                    continue
                seen.add(other)
                queue.append(other)
                rows.append(
                    {
                        "video_id": signatures[other].video_id,
                        "group_id": group_id,
                        "representative": name,
                        "matched_to": signatures[node].video_id,
                        "matched_share": share,
                        # `offset` is where node's clips sit in other's; the row says where other's sit in node's
                        "offset_s": -offset,
                    }
                )
    return sorted(rows, key=lambda row: (row["group_id"], row["matched_to"] is not None, row["video_id"]))


def run(cfg: Config, work_dir, executor, *, force: bool = False, quiet: bool = False) -> dict:
    """Group the collection unless its groups are current (its record's lineage: the dedup config and the
    digest of every decode and quality part)."""
    from pipeline.progress import Progress

    work = WorkDir(work_dir)
    checker = lineage.Lineage(work, cfg)
    expected = checker.expected("dedup")  # every decode and quality shard current, or InputNotReady
    state = checker.state("dedup", verify=True)
    if state.current and not force:
        return {"stage": "dedup", "skipped": True, **{k: state.record.get(k) for k in ("groups", "copies")}}
    started = time.time()
    with Progress(total=None, unit="shards", desc="dedup signatures", quiet=quiet):
        signatures = read_signatures(cfg, work, checker)
    comparable = [index for index, s in enumerate(signatures) if len(s.hashes) >= cfg.dedup.min_matched_frames]
    descriptors = np.stack([signatures[index].descriptor() for index in comparable]) if comparable else None
    local_pairs = candidate_pairs(descriptors, cfg.dedup.neighbours) if comparable else []
    pairs = [(comparable[i], comparable[j]) for i, j in local_pairs]
    indexed_at = time.time()
    copies = verified_pairs(cfg, signatures, pairs, executor)
    rows = groups(signatures, copies)
    table = pa.Table.from_pylist(rows, schema=schemas.DEDUP_GROUPS.arrow)
    from pipeline.engine.runner import output_provenance
    from pipeline.registry import stage as stage_record

    work.record("dedup").unlink(missing_ok=True)
    written = storage.write_parquet(
        work.dedup_groups,
        table,
        output_provenance(cfg, stage_record("dedup"), schemas.DEDUP_GROUPS, Provenance()),
        temporaries=work.temporaries,
    )
    outputs = lineage.output_entry(work, work.dedup_groups, table.num_rows, written)
    group_count = len({row["group_id"] for row in rows})
    stats = {
        "videos": len(signatures),
        "videos_compared": len(comparable),
        "candidate_pairs": len(pairs),
        "copy_pairs": len(copies),
        "groups": group_count,
        "copies": len(rows) - group_count,
        "index_seconds": round(indexed_at - started, 3),
        "seconds": round(time.time() - started, 3),
    }
    lineage.write_record(work, "dedup", None, expected, outputs, stats)
    return {"stage": "dedup", **stats}


def run_collection(job: CollectionRun) -> CollectionResult:
    """The stage's run: the groups made unless current, the comparisons on the command's executor."""
    stats = run(job.cfg, job.work_dir, job.executor, force=job.options["force"], quiet=job.quiet)
    if stats.get("skipped"):
        return CollectionResult(
            "the groups are current", [f"dedup: the groups are current ({stats.get('groups')} group(s))"]
        )
    outcome = f"{stats['groups']} group(s), {stats['copies']} copies"
    return CollectionResult(outcome, [json.dumps(stats, indent=2, default=str)])
