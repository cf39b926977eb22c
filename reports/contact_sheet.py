"""The contact sheet of a gallery level: its rows as one picture (a label column, then each node's nearest
thumbnails), as PNG bytes with text chunks; when the codebook's features come from random S3D weights,
every picture of it carries the NOT-pretrained warning (a band across the sheet's top)."""

from __future__ import annotations

import io

from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

import schemas.codebook as codebook_format
from reports.cells import counted
from reports.nearest import NodeClips

LABEL_WIDTH_PX = 190  # the contact sheet's label column
LINE_PX = 14  # a line of the contact sheet's text
WARNING_BACKGROUND, WARNING_INK = (255, 236, 204), (170, 68, 0)
NOT_PRETRAINED = "NOT pretrained: features from random S3D weights, so these clusters are not semantic"


def s3d_weights(codebook: codebook_format.Codebook) -> str:
    """The S3D weights the codebook's features were made with, as its provenance records them."""
    return str(codebook.info.get("feature_provenance", {}).get("weights", "unknown"))


def not_pretrained_warning(codebook: codebook_format.Codebook) -> str | None:
    """The warning every picture of this codebook carries, when its features come from random weights."""
    return NOT_PRETRAINED if s3d_weights(codebook).startswith("random") else None


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


def contact_sheet(
    codebook: codebook_format.Codebook, entries: list[NodeClips], thumbnails: dict, cell: int, per_row: int
) -> Image.Image:
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
        lines = [
            f"L{entry.level} node {entry.node}",
            f"path {codebook_format.path_label(codebook.k, entry.level, entry.node)}",
            counted(members, "member") if members else "empty",
        ]
        if members and entry.clips:  # the video's name is on the page: here, only that there is one
            lines.append("one video only" if entry.only_video else counted(len(entry.videos), "video"))
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


def png_bytes(image: Image.Image, text: dict[str, str]) -> bytes:
    """PNG bytes, with `text` as tEXt chunks (what the picture says, for readers of its metadata)."""
    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False, pnginfo=info)
    return buffer.getvalue()
