"""The run report on a small finished work dir (tests/gallery_factory.py): its numbers, its structure (every
image embedded and valid, every plot drawn, nothing fetched), partial runs, and a render in headless
Chromium (skipped where Debian's `chromium` is not installed)."""

import base64
import html
import io
import json
import re
import shutil
import subprocess

import gallery_factory as factory
import pytest
from PIL import Image

from pipeline import cli
from pipeline.config import load_config
from reports.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return factory.make_work_dir(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def report(work):
    path = write_report(load_config(None, []), work)
    return path, path.read_text(), json.loads((work / "report.json").read_text())


def test_numbers_match_the_work_dir(report):
    _, _, data = report
    words = data["visual_words"]
    assert words["clips_quantized"] == sum(factory.CLIPS.values()) == sum(words["frequency_by_rank"])
    assert words["frequency_by_rank"] == sorted(words["frequency_by_rank"], reverse=True)
    assert words["empty_leaves"] == 1 and words["leaves"] == factory.K**factory.DEPTH
    assert [level["size_bins"]["0"] for level in words["levels"]] == [0, 1]
    assert sum(words["levels"][1]["size_bins"].values()) == 9
    text = data["text"]
    assert text["coverage"] == pytest.approx(factory.expected_text_coverage(), abs=1e-4)
    # sentences of 6, 4 and 3 words; the two English ones became text segments of 6 and 4 WordPiece ids
    assert {n: c for n, c in enumerate(text["words_per_sentence"]) if c} == {3: 1, 4: 1, 6: 1}
    assert {n: c for n, c in enumerate(text["wordpieces_per_text_segment"]) if c} == {4: 1, 6: 1}
    assert text["segments"] == {"text_video": 2, "video_only": 3}
    assert text["asr_status"] == {"no_audio": 2, "ok": 2}
    decode = data["stages"]["decode"]
    assert (decode["shards"], decode["clips"], decode["seconds"], decode["clips_per_s"]) == (2, 31, 4.0, 7.75)
    assert data["stages"]["asr"]["realtime_factor"] == round(31 * 1.5 / 6.0, 2)
    assert data["summary"]["errors"] == {"decode": {"VideoDecodeError": 1}}
    assert [row["video_id"] for row in data["error_examples"]] == ["v3"]


def test_page_is_self_contained_with_every_image_and_plot(report):
    _, page, data = report
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from a network
    sources = re.findall(r'<img src="([^"]+)"', page)
    example = data["examples"][0]
    assert [e["video_id"] for e in data["examples"]] == ["v0"]  # the only video with text
    assert len(sources) == len(example["clips"]) == len(example["visual_ids"]) == 4
    for source in sources:
        assert source.startswith("data:image/jpeg;base64,")
        Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1]))).load()
    # each thumbnail's caption is the token the segment holds, in order
    assert re.findall(r"<figcaption>v(\d+)</figcaption>", page) == [str(t) for t in example["visual_ids"]]
    assert "cut the onions into thin slices." in page
    titles = re.findall(r"<svg [^>]*><title>([^<]+)</title>", page)
    assert titles == [
        "visual-token frequency by rank",
        "level 1: 3 nodes, 0 empty",
        "level 2: 9 nodes, 1 empty",
        "share of each video&#x27;s clips inside a text segment",
        "words per ASR sentence",
        "WordPiece tokens per text segment",
    ]
    assert page.count("<polyline") == 1
    stage_rows = re.findall(
        r'<tr><td class="text">(decode|features|quantize|asr|align)</td><td class="num">2/2</td>', page
    )
    assert stage_rows == ["decode", "features", "quantize", "asr", "align"]
    assert "VideoDecodeError" in page and "Invalid data found when processing input" in page
    assert "not semantic" in page  # random S3D weights are flagged


def test_report_is_deterministic(work, report):
    _, page, _ = report
    assert write_report(load_config(None, []), work).read_text() == page


def test_partial_run_says_what_to_run_next(tmp_path):
    work = factory.make_work_dir(tmp_path, stages=("decode",))
    page = write_report(load_config(None, []), work).read_text()
    # every per-shard stage but decode: features, shots, quality, quantize, asr, align
    assert page.count(">not run</td>") == 6
    assert "no codebook yet: run the kmeans stage" in page and "no ASR output yet: run the asr stage" in page


def test_training_log_is_plotted(tmp_path):
    work = factory.make_work_dir(tmp_path)
    (work / "train").mkdir()
    records = [{"event": "start", "step": 0}] + [
        {
            "event": "train",
            "step": step,
            "loss": 10.0 / step,
            "mlm_text_loss": 2.0,
            "mlm_text_acc": 0.25,
            "tokens_per_s": 900.0,
        }
        for step in (5, 10, 15)
    ]
    (work / "train" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report(load_config(None, []), work).read_text()
    assert "<title>training loss</title>" in page and "step 15, loss 0.6667" in page


def test_without_a_manifest_nothing_is_written(tmp_path, capsys):
    assert cli.main(["report", "--work-dir", str(tmp_path)]) == 1
    assert "nothing has run" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()


# injected before the page's own content: counts loaded images and drawn plots once the page has loaded
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(e.message || (e.target && e.target.tagName)), true);
window.addEventListener('load', () => {
  const images = [...document.images], plots = [...document.querySelectorAll('svg')];
  const out = document.createElement('pre'); out.id = 'probe';
  out.textContent = JSON.stringify({images: images.length,
    loaded: images.filter(i => i.complete && i.naturalWidth > 0).length,
    plots: plots.length, drawn: plots.filter(p => p.getBBox().width > 0).length, errors: window.__errors});
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    _, page, _ = report
    probed = tmp_path / "report.html"
    probed.write_text(page.replace("<head>", "<head>" + PROBE, 1))
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert found, result.stderr[-2000:]
    probe = json.loads(html.unescape(found.group(1)))
    assert probe["errors"] == []
    assert probe["images"] == probe["loaded"] == 4
    assert probe["plots"] == probe["drawn"] == 6


# ---------------------------------------------------------------- charts that read right

BAR = re.compile(r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)" fill="#2a6fb0"><title>')
Y_TICK = re.compile(r'<text x="60" y="[\d.]+" text-anchor="end">([^<]+)</text>')
X_LABEL = re.compile(r'<text x="[\d.]+" y="244" text-anchor="middle">([^<]+)</text>')


def _charts(page: str) -> list[str]:
    return re.findall(r"<svg .*?</svg>", page, re.S)


@pytest.mark.parametrize("values", [[1], [3, 1, 2], [13, 11, 7], [0, 4, 1560], [5, 5, 5, 5]])
def test_count_bars_have_whole_number_ticks_and_room_above_the_tallest(values):
    from reports.svg import TOP, svg_bars

    chart = svg_bars([str(i) for i in range(len(values))], values, title="t", x_label="x", y_label="n")
    ticks = Y_TICK.findall(chart)
    assert ticks and all(re.fullmatch(r"\d+(\.\d+)?k?", tick) for tick in ticks), ticks
    assert all(float(tick.rstrip("k")) * (1000 if tick.endswith("k") else 1) % 1 == 0 for tick in ticks)
    tops = [float(y) for y, height in BAR.findall(chart) if float(height) > 0]
    assert min(tops) > TOP + 1  # the tallest bar ends below the frame's top edge
    if 1560 in values:
        assert "2: 1,560</title>" in chart  # the bar's own value, as a reader writes it


def test_report_charts_have_integer_count_ticks_headroom_and_matching_captions(report):
    _, page, _ = report
    from reports.svg import TOP

    for chart in _charts(page):
        title = re.search(r"<title>([^<]+)</title>", chart).group(1)
        if BAR.search(chart):  # bar charts: every one counts something
            assert all(re.fullmatch(r"\d+k?", tick) for tick in Y_TICK.findall(chart)), title
            assert min(float(y) for y, _ in BAR.findall(chart)) > TOP + 1, title
    assert "last bin" not in page and "e+" not in page and "e-0" not in page
    # neither the words nor the WordPiece lengths reach their caps here: the captions say nothing of a cap
    labels = X_LABEL.findall(page)
    assert "words" in labels and "tokens" in labels
    assert '<td class="num">7.75 clips/s</td>' in page  # decode: 31 clips in 4 shard-seconds


def test_a_capped_length_histogram_names_its_last_bin_as_the_axis_shows_it():
    from reports.text import text_html as _text_html

    wordpieces = [0] * 65
    wordpieces[5], wordpieces[64] = 3, 2  # two segments at train.max_len 64 or longer
    text = {
        "asr_status": {"ok": 1},
        "languages": {"en": 1},
        "text_languages": ["en"],
        "words_per_sentence": [0] * 61,
        "segments": {},
        "coverage": {},
        "wordpieces_per_text_segment": wordpieces,
        "wordpiece_cap": 64,
    }
    chart = _charts(_text_html(text))[-1]
    shown = re.findall(r'<text x="[\d.]+" y="220" text-anchor="middle">([^<]+)</text>', chart)
    assert shown[-1] == "63-64+" and X_LABEL.findall(chart) == ["tokens (64+ = train.max_len or more)"]


def test_rates_in_the_stage_table_are_readable(tmp_path):
    from reports.stage_table import stages_html as _stages_html

    data = {
        "summary": {
            "shards": 1,
            "stages": {"decode": {"shards_complete": 1, "shards_total": 1, "rows": 1560}},
            "errors": {},
        },
        "stages": {
            "decode": {
                "shards": 1,
                "seconds": 1.0,
                "wall_seconds": 90.0,
                "videos": 3,
                "clips": 1560,
                "clips_per_s": 1560.0,
            }
        },
    }
    page = _stages_html(data)
    assert '<td class="num">1,560 clips/s</td>' in page and '<td class="num">17.3 clips/s</td>' in page
    data["stages"]["decode"].update(seconds=7200.0, wall_seconds=7200.0, clips=1)
    assert '<td class="num">2 h/clip</td>' in _stages_html(data)


def zero_shot_report(rows: dict) -> dict:
    """DIR/eval/zero_shot.json as videobert/eval/zero_shot.py writes it (the keys the report reads)."""
    return {
        "step": 40,
        "segments": 8,
        "segment_source": "annotations.json",
        "verbs": 9,
        "nouns": 12,
        "template": "now let me show you how to [MASK] the [MASK]",
        "precision": "float32",
        "rankings": ["open", "closed"],
        "candidates": {"open": {"verb": 22501, "noun": 22502}, "closed": {"verb": 9, "noun": 12}},
        "results": rows,
        "notes": ["initial BERT prior: no MLM head weights"],
    }


def test_zero_shot_table_and_predicted_visual_words(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = factory.make_work_dir(tmp_path)
    evaluation = work / "eval"
    evaluation.mkdir()

    def row(top1):
        return {"verb": {"top1": top1, "top5": 0.5, "n": 8}, "noun": {"top1": top1 / 2, "top5": 0.75, "n": 8}}

    rows = {
        mode: {"videobert": row(0.25), "text_only_prior": row(0.125), "initial_bert_prior": row(0.0)}
        for mode in ("open", "closed")
    }
    rows["closed"]["chance"] = row(0.111)
    (evaluation / "zero_shot.json").write_text(json.dumps(zero_shot_report(rows)))
    (evaluation / "linear_probe.json").write_text(
        json.dumps(
            {
                "results": {"s3d_linear_probe": row(0.375)},
                "segments": {"train": 8, "test": 8},
                "split": "subsets",
                "classifier": "multinomial logistic regression",
                "feature": "mean S3D vector",
                "notes": [],
            }
        )
    )
    predicted = [
        {"sentence": "chop the onion", "visual_ids": [1, 4, 4], "probs": [0.5, 0.25, 0.125]},
        {"sentence": "an older file", "visual_ids": [factory.EMPTY_LEAF], "probs": [0.9]},
    ]
    pq.write_table(pa.Table.from_pylist(predicted), evaluation / "predict_video.parquet")
    page = write_report(load_config(None, []), work).read_text()
    data = json.loads((work / "report.json").read_text())

    tables = re.findall(r"<h3>([^<]+)</h3><table>(.*?)</table>", page.replace("\n", ""))
    assert [title for title, _ in tables] == [
        "open vocabulary: 22,501 verb and 22,502 noun candidates",
        "closed set (the label lists): 9 verb and 12 noun candidates",
    ]
    names = [re.findall(r'<tr><td class="text">([^<]*)</td>', table) for _, table in tables]
    assert names == [
        ["VideoBERT (video + text)", "VideoBERT text-only prior", "initial BERT prior"],
        [
            "VideoBERT (video + text)",
            "VideoBERT text-only prior",
            "initial BERT prior",
            "S3D linear probe (supervised)",
            "chance (random ranking)",
        ],
    ]
    assert '<td class="num">37.5%</td><td class="num">50.0%</td><td class="num">18.8%</td>' in tables[1][1]
    assert "no MLM head weights" in page

    strip = data["predicted_video"]
    assert [[token["leaf"] for token in sentence["tokens"]] for sentence in strip] == [[1, 4, 4], [factory.EMPTY_LEAF]]
    section = page[page.index("<h2>Predicted visual words</h2>") :]
    images = re.findall(r'<img src="data:image/jpeg;base64,([^"]+)" alt="leaf (\d+): (\w+) clip (\d+)', section)
    # up to the 3 nearest clips of each of the 3 predicted words
    shown = [len(token["nearest"]) for token in strip[0]["tokens"]]
    assert len(images) == sum(shown) and all(1 <= n <= 3 for n in shown) and sum(shown) > 3
    exact = set(factory.EXACT_CLIP.values())
    for encoded, leaf, video, clip in images:
        colour = Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGB").getpixel((24, 24))
        # each thumbnail is a clip of that leaf (its colour), but for the clips placed on a level-1 centroid
        if (video, int(clip)) not in exact:
            assert all(abs(a - b) <= 8 for a, b in zip(colour, factory.leaf_colour(int(leaf)))), (leaf, colour)
    assert "v1 0.50" in section and f"v{factory.EMPTY_LEAF} 0.90 (empty leaf)" in section
    assert strip[1]["tokens"][0]["nearest"] == [] and strip[1]["tokens"][0]["empty"]


# ---------------------------------------------------------------- learning, warnings, predictions, videos


def _objectives(step: int, scale: float, **extra) -> dict:
    return {
        "step": step,
        "mlm_text_loss": 4.0 * scale,
        "mlm_text_acc": 0.2,
        "mlm_video_loss": 3.0 * scale,
        "mlm_video_acc": 0.1,
        "mlm_text_video_loss": 3.5 * scale,
        "mlm_text_video_acc": 0.15,
        "alignment_loss": 0.69 * scale,
        "alignment_acc": 0.5,
        **extra,
    }


def write_training_log(work, *, validation: bool, warnings=None) -> None:
    (work / "train").mkdir(exist_ok=True)
    header = {"event": "start", "step": 0, "notes": []}
    if warnings is not None:
        header.update(warnings=warnings, validation_videos=["v1"] if validation else [])
    records = [
        {"event": "start", "step": 0, "notes": ["an earlier run, started again"]},
        {"event": "train", "step": 5, "loss": 99.0, **_objectives(5, 20.0)},  # not the latest run
        header,
    ]
    for step in (5, 10, 15, 20):
        records.append({"event": "train", "loss": 12.0 / step, "tokens_per_s": 900.0, **_objectives(step, 1 / step)})
        if validation and step % 10 == 0:
            figures = {"alignment_auc": 0.6, "alignment_unmasked_acc": 0.75, "alignment_unmasked_auc": 0.8}
            records.append({"event": "validation", "videos": 1, **figures, **_objectives(step, 2 / step)})
    (work / "train" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"event": "tra')


def _titles(page: str) -> list[str]:
    return re.findall(r"<svg [^>]*><title>([^<]+)</title>", page)


def test_training_and_validation_curves_per_objective_side_by_side(tmp_path):
    work = factory.make_work_dir(tmp_path)
    write_training_log(work, validation=True, warnings=["3 of 5 text segments repeat one sentence"])
    page = write_report(load_config(None, []), work).read_text()
    data = json.loads((work / "report.json").read_text())
    assert [r["step"] for r in data["train"]] == [5, 10, 15, 20]  # the latest run only
    assert [r["step"] for r in data["validation"]] == [10, 20]
    assert data["train_header"]["validation_videos"] == ["v1"]
    titles = _titles(page)
    learning = titles[titles.index("training loss") :]
    assert learning[:5] == [
        "training loss",
        "training loss by objective",
        "validation loss by objective",
        "training accuracy by objective",
        "validation accuracy by objective",
    ]
    rows = re.findall(r'<div class="plots">((?:<svg .*?</svg>)+)</div>', page, re.S)
    paired = [_titles(row) for row in rows]
    assert ["training loss by objective", "validation loss by objective"] in paired
    assert ["training accuracy by objective", "validation accuracy by objective"] in paired
    charts = {re.search(r"<title>([^<]+)</title>", chart).group(1): chart for chart in _charts(page)}
    for title in ("training loss by objective", "validation loss by objective"):
        lines = re.findall(r"<polyline [^>]*><title>([^<]+)</title>", charts[title])
        assert lines == ["mlm_text", "mlm_video", "mlm_text_video", "alignment"], title
    assert "alignment AUC" in charts["validation accuracy by objective"]
    assert "alignment AUC" not in charts["training accuracy by objective"]
    # one loss axis and one step axis for the two: the same top tick, the same step ticks
    assert (
        Y_TICK.findall(charts["training loss by objective"])[-1]
        == Y_TICK.findall(charts["validation loss by objective"])[-1]
    )
    step_ticks = [
        re.findall(r'<text x="[\d.]+" y="220" text-anchor="middle">([^<]+)</text>', charts[title])
        for title in ("training loss by objective", "validation loss by objective")
    ]
    assert step_ticks[0] == step_ticks[1] and step_ticks[0][0] == "5" and step_ticks[0][-1] == "20"
    assert "validation loss (step 20)" in page and "1 held-out video (v1)" in page
    assert "alignment accuracy 0.500, AUC 0.600" in page
    assert "the same examples with nothing masked, accuracy 0.750, AUC 0.800" in page
    section = page[page.index("<h2>Warnings</h2>") : page.index("<h2>Stages</h2>")]
    assert "3 of 5 text segments repeat one sentence" in section
    assert data["summary"]["warnings"] == [{"stage": "train", "message": "3 of 5 text segments repeat one sentence"}]


def test_without_validation_records_no_validation_curve_is_drawn(tmp_path):
    work = factory.make_work_dir(tmp_path)
    write_training_log(work, validation=False)  # an older log: no warnings, no validation keys
    page = write_report(load_config(None, []), work).read_text()
    titles = _titles(page)
    assert "training loss by objective" in titles and "training accuracy by objective" in titles
    assert not any(title.startswith("validation") for title in titles)
    rows = [_titles(row) for row in re.findall(r'<div class="plots">((?:<svg .*?</svg>)+)</div>', page, re.S)]
    assert ["training loss", "training loss by objective", "training accuracy by objective"] in rows
    assert "no held-out videos" in page and "<h2>Warnings</h2>" not in page
    assert json.loads((work / "report.json").read_text())["summary"]["warnings"] == []


def test_summary_collects_the_codebook_and_training_warnings(tmp_path, capsys):
    from reports import summary

    work = factory.make_work_dir(tmp_path, codebook_warnings=["codebook depth 2, k 3 is too large for 4 fit clips"])
    write_training_log(work, validation=False, warnings=["fewer text segments (2) than a batch (8)"])
    assert cli.main(["summary", "--work-dir", str(work)]) == 0
    printed = capsys.readouterr().out
    expected = [
        {"stage": "kmeans", "message": "codebook depth 2, k 3 is too large for 4 fit clips"},
        {"stage": "train", "message": "fewer text segments (2) than a batch (8)"},
    ]
    assert json.loads((work / "summary.json").read_text())["warnings"] == expected
    assert "warning (kmeans): codebook depth 2, k 3 is too large for 4 fit clips" in printed
    assert "warning (train): fewer text segments (2) than a batch (8)" in printed
    page = write_report(load_config(None, []), work).read_text()
    section = page[page.index("<h2>Warnings</h2>") : page.index("<h2>Stages</h2>")]
    assert section.count("<li>") == 2 and "too large for 4 fit clips" in section
    (work / "train" / "log.jsonl").unlink()  # no training log: the codebook's only
    assert summary.warnings(work) == expected[:1]


def write_zero_shot(work, *, labels: bool, equal_rows: bool = False, prior=None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    evaluation = work / "eval"
    evaluation.mkdir(exist_ok=True)
    prior = prior or {"verb": ["cut", "fry", "add", "mix", "stir"], "noun": ["onion", "oil", "pan", "salt", "egg"]}
    report = zero_shot_report({})
    report.update(
        rankings=["closed"], segment_source="align", segments=3, prior_top5={"text_only_prior": {"closed": prior}}
    )
    if labels:

        def row(top1):
            return {"verb": {"top1": top1, "top5": 0.5, "n": 3}, "noun": {"top1": top1, "top5": 0.5, "n": 3}}

        report["results"] = {
            "closed": {
                "videobert": row(1 / 3),
                "text_only_prior": row(1 / 3 if equal_rows else 0.0),
                "chance": row(0.1),
            }
        }
    else:
        del report["results"]
    (evaluation / "zero_shot.json").write_text(json.dumps(report))
    segments = [
        ("v0", 0, 0.0, 6.0, ["cut"], ["onion"]),
        ("v0", 1, 6.0, 12.0, ["fry"], ["oil"]),
        ("v1", 0, 0.0, 15.0, [], []),
    ]
    records = []
    for video, index, start, end, verbs, nouns in segments:
        record = {
            "video_id": video,
            "segment_index": index,
            "start_s": start,
            "end_s": end,
            "verbs": verbs if labels else [],
            "nouns": nouns if labels else [],
        }
        for part in ("verb", "noun"):
            record[f"{part}_top5_closed"] = prior[part] if equal_rows or video == "v1" else prior[part][::-1]
            record[f"{part}_scores_closed"] = [-0.5, -1.0, -2.0, -3.0, -4.0]
        records.append(record)
    pq.write_table(pa.Table.from_pylist(records), evaluation / "zero_shot_predictions.parquet")


def test_zero_shot_predictions_are_shown_without_labels(tmp_path):
    work = factory.make_work_dir(tmp_path)
    write_zero_shot(work, labels=False)
    page = write_report(load_config(None, []), work).read_text()
    data = json.loads((work / "report.json").read_text())["zero_shot_predictions"]
    assert data["segments"] == 3 and len(data["sample"]) == 3
    assert data["same_as_text_only_prior"] == {"closed": {"verb": 1, "noun": 1}}
    assert data["sample"][0]["verb_top5_closed"][0] == ["stir", 0.6065]
    assert data["sample"][0]["text"] == "cut the onions into thin slices." and data["sample"][2]["text"] is None
    section = page[page.index("<h2>Zero-shot") :]
    assert "no labels (eval.labels)" in section and "Predictions for 3 of 3 segments (closed set)" in section
    table = re.search(r'<table class="predictions">(.*?)</table>', section).group(1)
    cells = re.findall(
        r'<tr><td class="text">v0 #0 0.0-6.0 s</td><td class="text">([^<]*)</td>'
        r'<td class="text">([^<]*)</td>',
        table,
    )
    assert cells == [("cut the onions into thin slices.", "stir 61%, mix 37%, add 14%, fry 5%, cut 1.8%")]
    assert "labels</th>" not in table  # no labels: no labels column
    assert "Segments whose top-5 equals it: verbs 1, nouns 1 of 3." in section
    assert "exactly the text-only prior" not in page  # 2 of 3 segments differ: no note


def test_a_videobert_row_equal_to_the_prior_is_pointed_out(tmp_path):
    work = factory.make_work_dir(tmp_path)
    write_zero_shot(work, labels=True, equal_rows=True)
    page = write_report(load_config(None, []), work).read_text()
    notes = re.findall(r'<p class="warning">([^<]+)</p>', page)
    assert (
        "closed set: the VideoBERT row equals the text-only prior row exactly: on these segments the video "
        "did not change a single accuracy" in notes
    )
    assert (
        "closed set: every one of the 3 segments&#x27; top-5 verbs and nouns are exactly the text-only "
        "prior&#x27;s: VideoBERT&#x27;s answer does not depend on the video" in notes
    )
    table = re.search(r'<table class="predictions">(.*?)</table>', page).group(1)
    assert "labels</th>" in table and "<b>cut</b>" in table  # a labelled word is bold

    write_zero_shot(work, labels=True, equal_rows=False)
    page = write_report(load_config(None, []), work).read_text()
    assert "exactly" not in " ".join(re.findall(r'<p class="warning">([^<]+)</p>', page))


def test_per_video_table_names_a_too_short_video_and_rejected_sentences(tmp_path):
    import pyarrow as pa

    import schemas
    from pipeline import storage
    from pipeline.engine import lineage
    from pipeline.engine.workdir import WorkDir
    from schemas.metadata import Provenance

    work = factory.make_work_dir(tmp_path, v3_too_short=True)
    # shard 0's ASR as schema version 2 writes it: each sentence says whether (and why) it was rejected
    sentence = pa.struct(
        [
            ("text", pa.string()),
            ("start_s", pa.float64()),
            ("end_s", pa.float64()),
            ("avg_word_prob", pa.float32()),
            ("rejected", pa.string()),
        ]
    )
    fields = [
        field if field.name != "sentences" else pa.field("sentences", pa.list_(sentence)) for field in schemas.ASR.arrow
    ]
    rows = [
        {
            "video_id": "v0",
            "status": "ok",
            "source": "base",
            "language": "en",
            "language_prob": 0.97,
            "audio_s": 18.0,
            "words": [],
            "sentences": [
                {
                    "text": "cut the onions into thin slices.",
                    "start_s": 0.0,
                    "end_s": 6.0,
                    "avg_word_prob": 0.9,
                    "rejected": None,
                },
                {"text": "fry them in oil.", "start_s": 6.0, "end_s": 12.0, "avg_word_prob": 0.8, "rejected": None},
                {"text": "thank you.", "start_s": 12.0, "end_s": 13.0, "avg_word_prob": 0.2, "rejected": "no_speech"},
            ],
        },
        {
            "video_id": "v1",
            "status": "no_audio",
            "source": "base",
            "language": None,
            "language_prob": None,
            "audio_s": 15.0,
            "words": [],
            "sentences": [],
        },
    ]
    storage.write_parquet(
        WorkDir(work).part("asr", 0),
        pa.Table.from_pylist(rows, schema=pa.schema(fields)),
        Provenance(stage="asr", schema="asr:2"),
    )
    lineage.record_external(work, "asr", 0, "tests", {"seconds": 3.0, "finished_at": 1000.0, "videos": 2})
    page = write_report(load_config(None, []), work).read_text()
    data = json.loads((work / "report.json").read_text())["videos"]
    assert data["videos"] == 4 and data["not_listed"] == 0
    by_id = {row["video_id"]: row for row in data["rows"]}
    assert [row["video_id"] for row in data["rows"]] == ["v0", "v1", "v2", "v3"]
    assert (by_id["v3"]["status"], by_id["v3"]["clips"], by_id["v3"]["errors"]) == ("too_short", 0, [])
    assert (by_id["v0"]["sentences_kept"], by_id["v0"]["sentences_rejected"]) == (2, 1)
    assert by_id["v0"]["rejected_by_reason"] == {"no_speech": 1}
    assert (by_id["v0"]["text_segments"], by_id["v0"]["video_only_segments"]) == (2, 1)
    # schema version 1 (shard 1): no `rejected` field, every sentence kept
    assert (by_id["v2"]["sentences_kept"], by_id["v2"]["sentences_rejected"], by_id["v2"]["language"]) == (1, 0, "es")
    table = re.search(r'<table class="videos">(.*?)</table>', page).group(1)
    v3 = re.search(r'<tr class="flagged"><td class="text">v3</td>(.*?)</tr>', table).group(1)
    assert '<td class="text">too_short</td>' in v3
    v0 = re.search(r'<tr[^>]*><td class="text">v0</td>(.*?)</tr>', table).group(1)
    assert '<td class="text">en 0.97</td>' in v0 and '<td class="text">1 (no_speech 1)</td>' in v0


def test_long_video_names_are_not_cut_in_charts():
    from reports.svg import svg_share_bars

    name = "a-very-long-video-name-from-a-crawl-" + "x" * 60
    chart = svg_share_bars([name, "v1"], [0.5, 0.25], title="share")
    assert f">{name}</text>" in chart
    width = float(re.search(r'<svg [^>]*width="(\d+)"', chart).group(1))
    label_w = float(re.search(r'<rect x="([\d.]+)"', chart).group(1))
    assert label_w >= 6 * len(name) and width > label_w


def test_a_series_without_values_is_left_out_and_the_others_keep_their_colours():
    from reports.svg import SERIES_COLOURS, svg_lines

    chart = svg_lines(
        [("a", [1, 2], [None, None]), ("b", [1, 2], [0.5, float("nan")]), ("c", [1, 2], [1.0, 2.0])],
        title="t",
        x_label="step",
        y_label="loss",
    )
    lines = re.findall(r'<polyline [^>]*stroke="([^"]+)"[^>]*><title>([^<]+)</title>', chart)
    assert lines == [(SERIES_COLOURS[1], "b"), (SERIES_COLOURS[2], "c")]
    assert chart.count("<circle") == 3  # b's one point is still shown
    assert ">no data<" in svg_lines([("a", [1], [None])], title="t", x_label="step", y_label="loss")
