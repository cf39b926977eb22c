"""The visual words as pictures: the clips nearest each node's centroid, so a codebook can be judged by eye
(the VideoBERT authors chose depth and k "by visually inspecting the coherence and representativeness of
the clusters").

A node's members are the clips whose descent (schemas.codebook.descend, the quantize stage's rule) passes
through it; they are ranked by the L2 distance of their feature to the node's centroid. The features are
streamed shard by shard and each shown node keeps only its best `per_cluster` clips, so memory is bounded
by the number of nodes shown, not by the collection. Thumbnails are the decode stage's (a clip's middle
frame), read only for the clips shown.

Writes DIR/gallery/:
- index.html (level 1) or level-<L>.html: a row per shown node (the largest N of the level by training
  members, or the ids asked for), labelled with its id, its path from the root and its member counts;
- node-<L>-<id>.html for each shown node above the leaves: its k children, each a row the same way;
- contact-level-<L>.png: the main page's rows as one image (linked from it); when the features come from
  random S3D weights, a warning band across its top says so, and its PNG text chunk "Warning" too;
- gallery.json: how they were made (codebook sha256, arguments, every clip shown with its distance).
Pages are self-contained: thumbnails are embedded as data: URIs."""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

import schemas.codebook as codebook_format
from pipeline import storage, visual_words
from pipeline.config import Config
from pipeline.engine.lineage import Lineage
from pipeline.engine.workdir import WorkDir
from pipeline.progress import Progress
from schemas import metadata

READ_BATCH_ROWS = 8_192
LABEL_WIDTH_PX = 190   # the contact sheet's label column
LINE_PX = 14           # a line of the contact sheet's text
WARNING_BACKGROUND, WARNING_INK = (255, 236, 204), (170, 68, 0)
NOT_PRETRAINED = "NOT pretrained: features from random S3D weights, so these clusters are not semantic"

PAGE_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.provenance, .note { color: #555; font-size: 0.9em; }
.warning { color: #a40; font-weight: bold; }
.cluster { display: flex; gap: 12px; align-items: flex-start; padding: 6px 0; border-top: 1px solid #eee; }
.cluster .label { flex: 0 0 190px; font-size: 0.9em; }
.cluster.empty .label { color: #999; }
.cluster .thumbs { flex: 1 1 auto; min-width: 0; }
/* one row of thumbnails per node at any page width: columns shrink below the thumbnails' size, never wrap */
.thumbs { display: grid; gap: 4px; }
figure { margin: 0; text-align: center; font-size: 0.75em; color: #666; }
figure img { display: block; image-rendering: auto; }
.thumbs figure { min-width: 0; } .thumbs figure img { max-width: 100%; height: auto; }
.thumbs figcaption { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
"""


def html_page(title: str, body: str) -> str:
    """A self-contained page: inline style, no script, no external reference."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(title)}</title><style>{PAGE_STYLE}</style></head>\n'
            f'<body>\n{body}\n</body></html>\n')


def html_table(header: list[str], rows: list[list]) -> str:
    """Numbers (with a unit, possibly) are right-aligned, text left-aligned."""
    def cell(value) -> str:
        numeric = bool(re.fullmatch(r"[-\d.,x/%]+( \S+)?", str(value)))
        return f'<td class="{"num" if numeric else "text"}">{html.escape(str(value))}</td>'
    head = "".join(f"<th>{html.escape(str(name))}</th>" for name in header)
    body = "".join("<tr>" + "".join(cell(value) for value in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def jpeg_data_uri(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")


def choose_nodes(codebook: codebook_format.Codebook, level: int, clusters: int,
                 node_ids: list[int] | None) -> list[int]:
    """The ids asked for (checked), else the `clusters` non-empty nodes of the level with the most
    training members (ties: lower id first)."""
    if not 1 <= level <= codebook.depth:
        raise ValueError(f"gallery: --level must be in 1..{codebook.depth} (the codebook's depth), got {level}")
    nodes_at_level = codebook.k ** level
    if node_ids:
        wrong = [node for node in node_ids if not 0 <= node < nodes_at_level]
        if wrong:
            raise ValueError(f"gallery: node id {wrong[0]} is not in 0..{nodes_at_level - 1} "
                             f"(level {level} has {nodes_at_level} nodes)")
        return list(dict.fromkeys(node_ids))
    if clusters < 1:
        raise ValueError(f"gallery: --clusters must be >= 1, got {clusters}")
    counts = codebook.counts[level - 1]
    order = np.lexsort((np.arange(len(counts)), -counts))
    return [int(node) for node in order[:clusters] if counts[node] > 0]


@dataclass(frozen=True)
class Clip:
    shard: int
    video_id: str
    clip_index: int
    start_s: float
    distance: float          # squared L2 distance of its feature to the node's centroid

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

    def offer(self, candidates: list[Clip]) -> None:
        self.nearest = sorted(self.nearest + candidates, key=lambda clip: clip.order_key)[:self.keep]


def feature_parts_checked(work_dir: Path, codebook: codebook_format.Codebook) -> list[tuple[int, Path]]:
    """The completed features parts; refused when their feature space is not the codebook's."""
    parts = Lineage(work_dir).current_parts("features")
    if not parts:
        raise FileNotFoundError(f"no current features shards under {WorkDir(work_dir).data_folder('features')}: "
                                f"run the features stage first")
    for shard, path in parts:
        footer = storage.parquet_file(path).metadata
        if footer.num_rows:
            codebook_format.check_feature_provenance(
                codebook, shard, metadata.read(footer.schema.to_arrow_schema()).feature_provenance_hash,
                "its clusters say nothing about these features")
    return parts


def nearest_clips(work_dir: Path, codebook: codebook_format.Codebook, nodes_by_level: dict[int, list[int]],
                  per_node: int, *, quiet: bool = False) -> dict[tuple[int, int], NodeClips]:
    """For each (level, node) asked for, its `per_node` member clips nearest its centroid, streaming the
    features shard by shard."""
    found = {(level, node): NodeClips(level, node, per_node)
             for level, nodes in nodes_by_level.items() for node in nodes}
    tracked = {level: np.array(sorted(nodes), dtype=np.int64) for level, nodes in nodes_by_level.items() if nodes}
    parts = feature_parts_checked(work_dir, codebook)
    with Progress(total=len(parts), unit="shards", desc="gallery", quiet=quiet) as progress:
        for shard, path in parts:
            clips_in_shard = 0
            for batch in storage.parquet_file(path).iter_batches(batch_size=READ_BATCH_ROWS,
                                                           columns=["video_id", "clip_index", "start_s", "feature"]):
                if not batch.num_rows:
                    continue
                clips_in_shard += batch.num_rows
                vectors = batch.column(3).flatten().to_numpy(zero_copy_only=False) \
                    .reshape(batch.num_rows, -1).astype(np.float32)
                # only as deep as the deepest level shown: the levels below cost most of a descent
                _, path_rows = visual_words.descend(codebook, vectors, return_path=True, levels=max(tracked))
                for level, level_nodes in tracked.items():
                    column = path_rows[:, level - 1]
                    rows = np.flatnonzero(np.isin(column, level_nodes))
                    if not len(rows):
                        continue
                    members = column[rows]
                    distances = ((vectors[rows] - codebook.centroids[level - 1][members]) ** 2).sum(axis=1)
                    order = np.lexsort((distances, members))    # by node, nearest first
                    nodes, firsts, counts = np.unique(members[order], return_index=True, return_counts=True)
                    for node, first, count in zip(nodes.tolist(), firsts.tolist(), counts.tolist()):
                        entry = found[(level, node)]
                        entry.clips += count
                        # only the candidates become Python objects, not the whole batch
                        entry.offer([Clip(shard, *(batch.column(c)[int(rows[i])].as_py() for c in range(3)),
                                          float(distances[i])) for i in order[first:first + min(count, per_node)]])
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
        for batch in storage.parquet_file(path).iter_batches(batch_size=READ_BATCH_ROWS,
                                                       columns=["video_id", "clip_index", "thumbnail_jpeg"]):
            for row, key in enumerate(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())):
                if key in keys:
                    thumbnails[(shard, *key)] = batch.column(2)[row].as_py()
    return thumbnails


# ---------------------------------------------------------------- rendering

def s3d_weights(codebook: codebook_format.Codebook) -> str:
    """The S3D weights the codebook's features were made with, as its provenance records them."""
    return str(codebook.info.get("feature_provenance", {}).get("weights", "unknown"))


def not_pretrained_warning(codebook: codebook_format.Codebook) -> str | None:
    """The warning every picture of this codebook carries, when its features come from random weights."""
    return NOT_PRETRAINED if s3d_weights(codebook).startswith("random") else None


def _codebook_note(codebook: codebook_format.Codebook) -> str:
    info = codebook.info
    weights = s3d_weights(codebook)
    note = (f"codebook depth {codebook.depth}, k {codebook.k}: {codebook.num_leaves:,} leaves; fit on "
            f"{info.get('sample_size', 0):,} clips; sha256 {str(info.get('sha256', '?'))[:16]}; "
            f"S3D weights {html.escape(weights)}")
    if not_pretrained_warning(codebook):
        note += '<br><span class="warning">features from random S3D weights: clusters are not semantic</span>'
    return f'<p class="provenance">{note}</p>'


def counted(number: int, noun: str) -> str:
    """`1 clip`, `2 clips`: a count with its noun in the right number."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _row_html(codebook: codebook_format.Codebook, entry: NodeClips, thumbnails: dict, link: str | None) -> str:
    level, node, k = entry.level, entry.node, codebook.k
    members = int(codebook.counts[level - 1][node])
    label = (f"<b>level {level}, node {node}</b><br>path {codebook_format.path_label(k, level, node)}<br>"
             f"{counted(members, 'training member')}<br>{counted(entry.clips, 'clip')} in this run")
    if members == 0:
        return (f'<section class="cluster empty" id="node-{level}-{node}" data-level="{level}" data-node="{node}">'
                f'<div class="label">{label}<br>empty: descent never chooses it</div></section>')
    if link:
        label += f'<br><a href="{link}">its {k} children &rarr;</a>'
    figures = []
    for clip in entry.nearest:
        jpeg = thumbnails.get((clip.shard, clip.video_id, clip.clip_index))
        if jpeg is None:
            continue   # counted in the sidecar as missing
        title = html.escape(f"{clip.video_id} clip {clip.clip_index} at {clip.start_s:.1f}s, "
                            f"squared distance {clip.distance:.4g}", quote=True)
        # under each thumbnail: where it is from (the video, the clip's start) and its distance
        figures.append(f'<figure><img src="{jpeg_data_uri(jpeg)}" alt="{title}" title="{title}">'
                       f'<figcaption title="{title}">{html.escape(clip.video_id)}<br>{clip.start_s:.1f} s &middot; '
                       f'd {clip.distance:.3g}</figcaption></figure>')
    columns = f"grid-template-columns: repeat({max(entry.keep, 1)}, minmax(0, max-content))"
    return (f'<section class="cluster" id="node-{level}-{node}" data-level="{level}" data-node="{node}">'
            f'<div class="label">{label}</div><div class="thumbs" style="{columns}">{"".join(figures)}</div>'
            f'</section>')


def _wrap(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> list[str]:
    """`text` in lines no wider than `width` pixels (a word longer than that gets a line of its own)."""
    lines, line = [], ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if line and draw.textlength(candidate, font=font) > width:
            lines.append(line)
            candidate = word
        line = candidate
    return lines + [line] if line else lines


def contact_sheet(codebook: codebook_format.Codebook, entries: list[NodeClips], thumbnails: dict,
                  cell: int, per_row: int) -> Image.Image:
    """The rows as one picture: a label column, then each node's nearest thumbnails, nearest first; across
    the top, the NOT-pretrained warning when the features come from random weights."""
    font = ImageFont.load_default(size=12)
    row_height = max(cell, 56) + 4
    width = LABEL_WIDTH_PX + per_row * (cell + 2)
    warning = not_pretrained_warning(codebook)
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    warning_lines = _wrap(measure, warning, font, width - 8) if warning else []
    band = len(warning_lines) * LINE_PX + 8 if warning_lines else 0
    sheet = Image.new("RGB", (width, band + max(len(entries), 1) * row_height), "white")
    draw = ImageDraw.Draw(sheet)
    if band:
        draw.rectangle((0, 0, width - 1, band - 1), fill=WARNING_BACKGROUND)
        for number, text in enumerate(warning_lines):
            draw.text((4, 4 + LINE_PX * number), text, fill=WARNING_INK, font=font)
    for row, entry in enumerate(entries):
        top = band + row * row_height
        members = int(codebook.counts[entry.level - 1][entry.node])
        lines = [f"L{entry.level} node {entry.node}",
                 f"path {codebook_format.path_label(codebook.k, entry.level, entry.node)}",
                 counted(members, "member") if members else "empty"]
        for number, text in enumerate(lines):
            draw.text((4, top + 4 + LINE_PX * number), text, fill="black", font=font)
        for column, clip in enumerate(entry.nearest):
            jpeg = thumbnails.get((clip.shard, clip.video_id, clip.clip_index))
            if jpeg is None:
                continue
            image = Image.open(io.BytesIO(jpeg)).convert("RGB")
            if image.size != (cell, cell):
                image = image.resize((cell, cell), Image.BILINEAR)
            sheet.paste(image, (LABEL_WIDTH_PX + column * (cell + 2), top + 2))
    return sheet


def _png_bytes(image: Image.Image, text: dict[str, str]) -> bytes:
    """PNG bytes, with `text` as tEXt chunks (what the picture says, for readers of its metadata)."""
    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False, pnginfo=info)
    return buffer.getvalue()


@dataclass
class GalleryView:
    """The nodes a gallery level shows, and for each shown node the children its own page lists."""
    level: int
    shown: list[int]
    children: dict[int, list[int]]     # parent -> its k children (empty ones included)

    @property
    def parents(self) -> list[int]:
        return list(self.children)


def plan_view(codebook: codebook_format.Codebook, level: int, clusters: int, node_ids: list[int] | None) -> GalleryView:
    """The nodes to show and, below each non-empty one above the leaves, the children for its page."""
    shown = choose_nodes(codebook, level, clusters, node_ids)
    parents = [node for node in shown if level < codebook.depth and codebook.counts[level - 1][node] > 0]
    return GalleryView(level, shown, {parent: list(range(parent * codebook.k, (parent + 1) * codebook.k))
                                      for parent in parents})


def gather_clips(work_dir, codebook, view: GalleryView, per_cluster: int, *,
                 quiet: bool) -> tuple[dict[tuple[int, int], NodeClips], dict]:
    """The nearest clips of every shown node and child (one scan of the features), and their thumbnails."""
    nodes_by_level = {view.level: view.shown}
    if view.parents:
        nodes_by_level[view.level + 1] = [child for group in view.children.values() for child in group
                                          if codebook.counts[view.level][child] > 0]
    found = nearest_clips(work_dir, codebook, nodes_by_level, per_cluster, quiet=quiet)
    for child in (child for group in view.children.values() for child in group):
        # empty children were not searched: they are shown as empty rows
        found.setdefault((view.level + 1, child), NodeClips(view.level + 1, child, per_cluster))
    every_clip = [clip for entry in found.values() for clip in entry.nearest]
    thumbnails = read_thumbnails(work_dir, [(clip.shard, clip.video_id, clip.clip_index) for clip in every_clip])
    return found, thumbnails


def _level_page(codebook, view: GalleryView, found, thumbnails, per_cluster: int, node_ids, main_name: str,
                sheet_name: str) -> str:
    how = (f"up to {per_cluster} clips nearest each node's centroid; nodes: "
           + (f"ids {', '.join(map(str, view.shown))}" if node_ids else
              f"the {len(view.shown)} largest of level {view.level}"))
    child_page = {parent: _child_page_name(view.level, parent) for parent in view.parents}
    body = [f"<h1>Visual words: level {view.level} of {codebook.depth}</h1>", _codebook_note(codebook),
            f'<p class="note">{html.escape(how)}; the number under a thumbnail is its squared distance to '
            f'the centroid. Hover for the video and time. How this was made: gallery.json. These rows as one '
            f'picture: <a href="{sheet_name}">{sheet_name}</a>.</p>']
    body += [_row_html(codebook, found[(view.level, node)], thumbnails, child_page.get(node)) for node in view.shown]
    return html_page(f"Visual words, level {view.level}", "\n".join(body))


def _child_page_name(level: int, parent: int) -> str:
    return f"node-{level}-{parent}.html"


def _child_page(codebook, view: GalleryView, parent: int, found, thumbnails, main_name: str) -> str:
    level = view.level
    rows = [_row_html(codebook, found[(level + 1, child)], thumbnails, None) for child in view.children[parent]]
    body = [f'<p><a href="{main_name}">&larr; level {level}</a></p>',
            f"<h1>Node {parent} (path {codebook_format.path_label(codebook.k, level, parent)}) and its "
            f"{codebook.k} children at level {level + 1}</h1>", _codebook_note(codebook),
            _row_html(codebook, found[(level, parent)], thumbnails, None), "<h2>Children</h2>", *rows]
    return html_page(f"Visual words, node {level}-{parent}", "\n".join(body))


def _sheet_png(cfg: Config, codebook, view: GalleryView, found, thumbnails, per_cluster: int) -> bytes:
    """The level's rows as one picture, with its provenance (and the NOT-pretrained warning) in its text."""
    sheet = contact_sheet(codebook, [found[(view.level, node)] for node in view.shown], thumbnails,
                          cfg.decode.thumbnail_size, per_cluster)
    png_text = {"Title": f"Visual words: level {view.level} of {codebook.depth}",
                "Source": f"codebook sha256 {codebook.info.get('sha256', '?')}; S3D weights {s3d_weights(codebook)}"}
    if warning := not_pretrained_warning(codebook):
        png_text["Warning"] = warning
    return _png_bytes(sheet, png_text)


def _sidecar(codebook, found, thumbnails, written: list[Path], *, level: int, clusters: int, per_cluster: int,
             node_ids) -> dict:
    every_clip = [clip for entry in found.values() for clip in entry.nearest]
    missing = sum(1 for clip in every_clip if (clip.shard, clip.video_id, clip.clip_index) not in thumbnails)
    return {
        "level": level, "clusters": clusters, "per_cluster": per_cluster, "node_ids": node_ids,
        "codebook_sha256": codebook.info.get("sha256"),
        "feature_provenance_hash": codebook.info.get("feature_provenance_hash"),
        "distance": "squared L2 to the node's centroid; members are the clips whose descent passes through it",
        "missing_thumbnails": missing,
        "pages": [path.name for path in written],
        "nodes": [{"level": entry.level, "node": entry.node,
                   "path": codebook_format.node_path(codebook.k, entry.level, entry.node),
                   "training_members": int(codebook.counts[entry.level - 1][entry.node]), "clips": entry.clips,
                   "nearest": [{"video_id": clip.video_id, "clip_index": clip.clip_index, "start_s": clip.start_s,
                                "shard": clip.shard, "distance": clip.distance} for clip in entry.nearest]}
                  for entry in sorted(found.values(), key=lambda e: (e.level, e.node))],
    }


def write_gallery(cfg: Config, work_dir: Path, *, level: int = 1, clusters: int = 12, per_cluster: int = 12,
                  node_ids: list[int] | None = None, quiet: bool = False) -> list[Path]:
    """Write the gallery pages of one level (see the module docstring); returns the paths written."""
    work = WorkDir(work_dir)
    if per_cluster < 1:
        raise ValueError(f"gallery: --per-cluster must be >= 1, got {per_cluster}")
    codebook = visual_words.load(work.codebook)
    # which nodes, then their nearest clips and thumbnails (one scan of the features)
    view = plan_view(codebook, level, clusters, node_ids)
    found, thumbnails = gather_clips(work.root, codebook, view, per_cluster, quiet=quiet)
    # the level's page, its contact sheet, a page per shown node's children, and how it was all made
    folder = work.gallery
    main_name = "index.html" if level == 1 else f"level-{level}.html"
    sheet = folder / f"contact-level-{level}.png"
    pages = {folder / main_name: _level_page(codebook, view, found, thumbnails, per_cluster, node_ids, main_name,
                                             sheet.name).encode(),
             sheet: _sheet_png(cfg, codebook, view, found, thumbnails, per_cluster)}
    for parent in view.parents:
        pages[folder / _child_page_name(level, parent)] = _child_page(codebook, view, parent, found, thumbnails,
                                                                      main_name).encode()
    for path, data in pages.items():
        storage.atomic_write_bytes(path, data)
    written = list(pages)
    storage.atomic_write_json(folder / "gallery.json", _sidecar(codebook, found, thumbnails, written, level=level,
                                                                clusters=clusters, per_cluster=per_cluster,
                                                                node_ids=node_ids))
    return written + [folder / "gallery.json"]
