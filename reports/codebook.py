"""The run report's visual-words section: token frequency by rank (log-log), the codebook's node-size
histogram per level, empty leaves and leaves no clip of this run reached, and the level-1 nodes whose clips
all come from one video (named, as the gallery does)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from pipeline import storage, visual_words
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from reports import summary
from reports.cells import counted, number
from reports.contact_sheet import s3d_weights
from reports.gallery import ONE_VIDEO_NODE, one_video_nodes
from reports.nearest import VIDEOS_COUNTED, decode_statuses
from reports.svg import fmt_number, svg_bars, svg_line

RANK_POINTS = 400  # points drawn on the rank-frequency curve (log-spaced ranks)


def _size_bins(counts: np.ndarray) -> tuple[list[str], list[int]]:
    """Node sizes in powers of two: 0 (empty), 1, 2-3, 4-7, ...; (labels, number of nodes per bin)."""
    top = int(counts.max()) if len(counts) else 0
    labels, values = ["0"], [int((counts == 0).sum())]
    low = 1
    while low <= top:
        high = low * 2 - 1
        labels.append(f"{fmt_number(low)}" if low == high else f"{fmt_number(low)}-{fmt_number(high)}")
        values.append(int(((counts >= low) & (counts <= high)).sum()))
        low *= 2
    return labels, values


def level_one_videos(work_dir: Path, k: int, depth: int) -> list[dict]:
    """Per level-1 node, this run's clips in it (from their tokens: a leaf's level-1 ancestor is
    leaf // k**(depth-1)), how many videos they come from (up to VIDEOS_COUNTED) and, when one, which. Read
    part by part: memory is a shard's two columns and k sets of names."""
    divisor = k ** (depth - 1)
    clips, videos = np.zeros(k, dtype=np.int64), [set() for _ in range(k)]
    for _, path in Lineage(work_dir).current_parts("quantize"):
        table = storage.read_table(path, columns=["video_id", "token"])
        if not table.num_rows:
            continue
        encoded = table["video_id"].combine_chunks().dictionary_encode()
        names, nodes = encoded.dictionary.to_pylist(), table["token"].to_numpy() // divisor
        clips += np.bincount(nodes, minlength=k)[:k]
        for pair in np.unique(nodes.astype(np.int64) * len(names) + encoded.indices.to_numpy()).tolist():
            node, code = divmod(pair, len(names))
            if len(videos[node]) < VIDEOS_COUNTED:
                videos[node].add(names[code])
    return [
        {
            "node": node,
            "clips": int(clips[node]),
            "videos": len(names),
            "only_video": next(iter(names)) if len(names) == 1 else None,
        }
        for node, names in enumerate(videos)
    ]


def visual_word_stats(work_dir: Path) -> dict | None:
    """Token counts from quantize and the codebook's node sizes; None before the codebook exists."""
    try:
        codebook = visual_words.load(WorkDir(work_dir).codebook)
    except FileNotFoundError:
        return None
    token_counts = summary.token_counts(work_dir, codebook.num_leaves)[: codebook.num_leaves]
    by_rank = np.sort(token_counts[token_counts > 0])[::-1]
    total = int(token_counts.sum())
    probabilities = by_rank / max(total, 1)
    leaf_counts = codebook.counts[-1]
    level_one = level_one_videos(work_dir, codebook.k, codebook.depth) if total else []
    alone = {node["only_video"] for node in level_one if node["only_video"]}
    return {
        "depth": codebook.depth,
        "k": codebook.k,
        "leaves": codebook.num_leaves,
        "codebook_sha256": codebook.info.get("sha256"),
        "sample_size": codebook.info.get("sample_size"),
        "weights": s3d_weights(codebook),
        "levels": [
            {
                "level": level,
                "nodes": int(len(counts)),
                "empty": int((counts == 0).sum()),
                "size_bins": dict(zip(*_size_bins(counts))),
            }
            for level, counts in enumerate(codebook.counts, start=1)
        ],
        "empty_leaves": int((leaf_counts == 0).sum()),
        "clips_quantized": total,
        "distinct_tokens": int(len(by_rank)),
        "unreached_nonempty_leaves": int(((leaf_counts > 0) & (token_counts == 0)).sum()) if total else None,
        "perplexity": round(float(np.exp(-(probabilities * np.log(probabilities)).sum())), 2) if total else None,
        "top_token_share": round(float(probabilities[0]), 4) if total else None,
        "frequency_by_rank": by_rank.tolist(),
        "level_one": level_one,
        "decode_status_of_alone": decode_statuses(work_dir, alone),
    }


def visual_words_html(words: dict | None) -> str:
    if words is None:
        return "<h2>Visual words</h2><p>no codebook yet: run the kmeans stage.</p>"
    parts = [
        "<h2>Visual words</h2>",
        f"<p>codebook: depth {words['depth']}, k {words['k']}: {counted(words['leaves'], 'leaf', 'leaves')}; "
        f"fit on {number(words['sample_size'])} clip{'' if words['sample_size'] == 1 else 's'}; "
        f"sha256 {html.escape(str(words['codebook_sha256'])[:16])}; "
        f"S3D weights {html.escape(words['weights'])}. Empty leaves (no training member): "
        f"{words['empty_leaves']:,}.</p>",
    ]
    if words["weights"].startswith("random"):
        parts.append('<p class="warning">features from random S3D weights: the visual words are not semantic</p>')
    if words["clips_quantized"]:
        parts.append(
            f"<p>{counted(words['clips_quantized'], 'clip')} quantized into "
            f"{counted(words['distinct_tokens'], 'distinct token')}; perplexity {words['perplexity']:,} (the "
            f"number of equally likely tokens with the same entropy); the most frequent token holds "
            f"{words['top_token_share']:.1%} of the clips; "
            f"{counted(words['unreached_nonempty_leaves'], 'non-empty leaf', 'non-empty leaves')} reached by "
            f"no clip of this run.</p>"
        )
    else:
        parts.append("<p>no quantized clips yet: run the quantize stage.</p>")
    alone = [node["only_video"] for node in words.get("level_one", []) if node["only_video"]]
    if alone:
        parts.append(
            f'<p class="warning">{len(alone)} of the {counted(words["k"], "level-1 node")} '
            f"{'holds' if len(alone) == 1 else 'hold'} the clips of one video only "
            f"({html.escape(one_video_nodes(alone, words['decode_status_of_alone']))}). "
            f"{html.escape(ONE_VIDEO_NODE)}</p>"
        )
    by_rank = words["frequency_by_rank"]
    ranks = sorted(set(np.geomspace(1, len(by_rank), RANK_POINTS).astype(int).tolist())) if by_rank else []
    plots = [
        svg_line(
            ranks,
            [by_rank[rank - 1] for rank in ranks],
            title="visual-token frequency by rank",
            x_label="rank",
            y_label="clips",
            log=True,
        )
    ]
    for level in words["levels"]:
        labels, values = list(level["size_bins"]), list(level["size_bins"].values())
        plots.append(
            svg_bars(
                labels,
                values,
                title=f"level {level['level']}: {level['nodes']:,} nodes, {level['empty']:,} empty",
                x_label="training members per node",
                y_label="nodes",
            )
        )
    return "\n".join(parts) + '<div class="plots">' + "".join(plots) + "</div>"
