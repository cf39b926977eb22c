"""Progress: periodic plain lines off a terminal, a bar on one, nothing with quiet; the local executor
counts a stage's shards in the parent process."""

import io

import gallery_factory as factory
import pytest

from pipeline import progress as progress_module
from pipeline.config import load_config
from pipeline.executors import LocalExecutor
from pipeline.progress import Progress


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
    # updates at 4, 8, 12, 16 and 20 s: a line at 12 s (the first 10 s passed), the final count on close
    assert lines[0] == "[decode part 0] 3/5 videos, 0.25 videos/s, 7.5 clips/s, ETA 8s, 12s elapsed"
    assert lines[-1].startswith("[decode part 0] 5/5 videos")
    assert len(lines) == 2


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
    work = factory.make_work_dir(tmp_path, stages=("decode",))   # both shards complete: they are skipped
    monkeypatch.setattr(Progress, "LOG_EVERY_S", 0.0)
    results = LocalExecutor(load_config(None, []), workers).run_shards(work, "decode", [1, 0])
    assert [r["shard"] for r in results] == [1, 0] and all(r["skipped"] for r in results)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["[decode] 1/2 shards", "[decode] 2/2 shards"]

    results = LocalExecutor(load_config(None, []), workers).run_shards(work, "decode", [0, 1], quiet=True)
    assert len(results) == 2 and capsys.readouterr().err == ""
