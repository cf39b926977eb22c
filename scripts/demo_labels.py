"""Zero-shot labels for the demo: each text segment of WORK/align gets the verbs and nouns of the scripted
narration sentence it overlaps most (recorded with the sentence in samples/narration.json by
scripts/make_samples.py), written to WORK/eval/labels.csv (several words of a kind are separated by |: a
prediction is right when it is any of them, as in the paper).

    python scripts/demo_labels.py WORK"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.engine.lineage import Lineage  # noqa: E402
from pipeline.engine.manifest import make_video_id  # noqa: E402
from pipeline.engine.workdir import WorkDir  # noqa: E402


def main(work: Path) -> Path:
    narration = json.loads((REPO / "samples" / "narration.json").read_text())["videos"]
    narration_by_id = {make_video_id(name): video for name, video in narration.items()}
    rows = []
    for _, part in Lineage(work).current_parts("align"):
        for segment in pq.read_table(
            part, columns=["video_id", "segment_index", "start_s", "end_s", "kind"]
        ).to_pylist():
            if segment["kind"] != "text_video":
                continue
            video = narration_by_id.get(segment["video_id"])
            if video is None:
                continue
            overlaps = [
                (min(s["end_s"], segment["end_s"]) - max(s["start_s"], segment["start_s"]), s)
                for s in video["sentences"]
                if "verbs" in s
            ]
            best = max(overlaps, default=(0.0, None), key=lambda overlap: overlap[0])
            if best[0] > 0:
                verbs, nouns = best[1]["verbs"], best[1]["nouns"]
                rows.append(
                    {
                        "video_id": segment["video_id"],
                        "segment_index": segment["segment_index"],
                        "verb": "|".join(verbs),
                        "noun": "|".join(nouns),
                    }
                )
    out = WorkDir(work).eval_folder / "labels.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["video_id", "segment_index", "verb", "noun"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} labelled segments -> {out}")
    return out


if __name__ == "__main__":
    main(Path(sys.argv[1]))
