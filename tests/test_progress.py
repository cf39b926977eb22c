"""Progress: periodic timestamped lines off a terminal, a bar on one, nothing with quiet; readable rates and
durations; the local executor counts a stage's shards in the parent process."""

import datetime
import io
import re

import gallery_factory as factory
import pytest

from pipeline import progress as progress_module
from pipeline.config import load_config
from pipeline.executors.local import LocalExecutor
from pipeline.progress import Progress, format_duration, format_number, format_rate

ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress_module, "time", fake)
    return fake


def test_off_a_terminal_it_prints_a_line_per_interval_and_the_final_count(clock):
    stream = io.StringIO()
    with Progress(total=5, unit="videos", desc="decode part 0", log_every_s=10, stream=stream) as bar:
        for _ in range(5):
            clock.now += 4
            bar.update(1, clips=30)
    lines = stream.getvalue().splitlines()
    # updates at 4, 8, 12, 16 and 20 s: a line at 12 s (the first 10 s passed), the final count on close;
    # each line starts with the local time it was printed at
    stamp, rest = lines[0].split(" ", 1)
    assert re.fullmatch(ISO_TIME, stamp) and datetime.datetime.fromisoformat(stamp).timestamp() == 1012.0
    assert rest == "[decode part 0] 3/5 videos, 15 videos/min, 7.5 clips/s, ETA 8s, 12s elapsed"
    assert re.fullmatch(ISO_TIME + r" \[decode part 0\] 5/5 videos, .*", lines[-1])
    assert len(lines) == 2


def test_hours_long_work_logs_with_readable_rates_and_durations(clock):
    stream = io.StringIO()
    with Progress(total=200, unit="shards", desc="features", log_every_s=600, stream=stream) as bar:
        for _ in range(3):
            clock.now += 3600
            bar.update(1, videos=40)
    line = stream.getvalue().splitlines()[0].split(" ", 1)[1]
    assert line == "[features] 1/200 shards, 1 shards/h, 40 videos/h, ETA 8d07h, 1h00m elapsed"


@pytest.mark.parametrize(
    "count, seconds, unit, expected",
    [
        (1560, 1.0, "clips", "1,560 clips/s"),
        (12, 10.0, "videos", "1.2 videos/s"),
        (1, 86.0, "shards", "41.9 shards/h"),
        (41, 60.0, "shards", "41 shards/min"),
        (1, 3 * 3600.0, "shards", "3 h/shard"),
        (0, 5.0, "videos", "0 videos/s"),
        (3, 0.0, "videos", "-"),
    ],
)
def test_rates_use_the_unit_that_gives_a_number_of_at_least_one(count, seconds, unit, expected):
    assert format_rate(count, seconds, unit) == expected


def test_numbers_and_durations_are_written_without_exponents():
    assert [format_number(v) for v in (0.0116, 0.000123, 7.5, 41.25, 1560.4, 1234567.0)] == [
        "0.0116",
        "0.000123",
        "7.5",
        "41.2",
        "1,560",
        "1,234,567",
    ]
    assert [format_duration(s) for s in (0.4, 59, 65, 3725, 90000)] == ["0s", "59s", "1m05s", "1h02m", "1d01h"]


def test_short_work_off_a_terminal_stays_silent(clock):
    stream = io.StringIO()
    with Progress(total=3, desc="quick", log_every_s=10, stream=stream) as bar:
        for _ in range(3):
            clock.now += 1
            bar.update(1)
    assert stream.getvalue() == ""


@pytest.mark.parametrize("stream_type", [io.StringIO, Terminal])
def test_quiet_prints_nothing(clock, stream_type):
    stream = stream_type()
    with Progress(total=3, desc="quiet", log_every_s=0, stream=stream, quiet=True) as bar:
        for _ in range(3):
            clock.now += 20
            bar.update(1)
    assert stream.getvalue() == ""


def test_on_a_terminal_it_draws_a_bar():
    stream = Terminal()
    with Progress(total=4, unit="videos", desc="features part 2", stream=stream) as bar:
        bar.update(4, clips=120)
        bar._bar.refresh()
    drawn = stream.getvalue()
    assert "features part 2" in drawn and "4/4" in drawn and "\r" in drawn


@pytest.mark.parametrize("workers", [1, 2])
def test_local_executor_counts_shards_in_the_parent(tmp_path, monkeypatch, capsys, workers):
    work = factory.make_work_dir(tmp_path, stages=("decode",))  # both shards complete: they are skipped
    monkeypatch.setattr(Progress, "LOG_EVERY_S", 0.0)
    results = LocalExecutor(load_config(None, []), workers).run_shards(work, "decode", [1, 0])
    assert [r["shard"] for r in results] == [1, 0] and all(r["skipped"] for r in results)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0].split(" ", 1)[1] for line in lines] == ["[decode] 1/2 shards", "[decode] 2/2 shards"]

    results = LocalExecutor(load_config(None, []), workers).run_shards(work, "decode", [0, 1], quiet=True)
    assert len(results) == 2 and capsys.readouterr().err == ""
