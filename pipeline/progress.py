"""Progress for long work: a bar on a terminal, plain periodic log lines elsewhere (CI, batch jobs).

Off a terminal every line starts with its local ISO 8601 time, so a Slurm or Ray log says when each count
was reached. Rates are written in the unit that gives a number of at least one ("41 shards/min", "1.2
videos/s", "3.5 min/shard"), never in scientific notation."""

from __future__ import annotations

import datetime
import sys
import time


def format_number(value: float) -> str:
    """Three significant digits without an exponent, thousands separated: 0.0116, 7.5, 41.3, 1,560."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    text = f"{value:.3g}"
    if "e" in text:  # below 0.001: as many places as three significant digits need
        text = f"{value:.{2 - int(f'{abs(value):e}'.split('e')[1])}f}"
    return text


def singular(unit: str) -> str:
    return unit[:-1] if unit.endswith("s") and len(unit) > 1 else unit


def format_rate(count: float, seconds: float, unit: str) -> str:
    """`count` units in `seconds` as the readable rate: per second, per minute or per hour when that is at
    least one, otherwise the time one unit takes ("12 h/shard"); "-" without any time."""
    if seconds <= 0:
        return "-"
    if count <= 0:
        return f"0 {unit}/s"
    per_second = count / seconds
    for name, factor in (("s", 1), ("min", 60), ("h", 3600)):
        if per_second * factor >= 1:
            return f"{format_number(per_second * factor)} {unit}/{name}"
    return f"{format_number(seconds / count / 3600)} h/{singular(unit)}"


def format_duration(seconds: float) -> str:
    """42s, 7m05s, 3h12m, 2d04h."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def timestamp(at: float) -> str:
    """Local time in ISO 8601 with its UTC offset, to the second."""
    return datetime.datetime.fromtimestamp(at).astimezone().isoformat(timespec="seconds")


class Progress:
    """`with Progress(total=n, unit="videos") as bar: bar.update(1, clips=30)`.

    Counts a main unit (with rate and ETA) and any number of extra counters (their rates shown too).
    Off a terminal it prints a timestamped line every `log_every_s` seconds, and on close the final count
    if it printed any line before: work shorter than the interval stays silent."""

    LOG_EVERY_S = 10.0

    def __init__(
        self,
        total: int | None,
        unit: str = "videos",
        desc: str = "",
        quiet: bool = False,
        log_every_s: float | None = None,
        stream=None,
    ):
        self.total, self.unit, self.desc, self.quiet = total, unit, desc, quiet
        self.stream = stream or sys.stderr
        self.log_every_s = self.LOG_EVERY_S if log_every_s is None else log_every_s
        self._logged_count: int | None = None  # the count in the last line printed
        self.count = 0
        self.failed = 0  # of `count`: units that ended in failure, never shown as done
        self.extra: dict[str, float] = {}
        self.started = time.time()
        self._last_log = self.started
        self._bar = None
        if not quiet and self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=f" {unit}", desc=desc, file=self.stream, leave=False, dynamic_ncols=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _rates(self) -> str:
        elapsed = time.time() - self.started
        parts = [format_rate(self.count, elapsed, self.unit)]
        parts += [format_rate(value, elapsed, name) for name, value in self.extra.items()]
        return ", ".join(parts)

    def update(self, n: int = 1, **extra: float) -> None:
        self.count += n
        for name, value in extra.items():
            self.extra[name] = self.extra.get(name, 0) + value
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(n)
            if self.extra:
                self._bar.set_postfix_str(self._rates(), refresh=False)
            return
        now = time.time()
        if now - self._last_log >= self.log_every_s:
            self._last_log = now
            self._print_line()

    def fail(self, n: int = 1) -> None:
        """`n` units that ended in failure (a crashed shard): handled, so the ETA counts them, but never
        shown as done."""
        self.failed += n
        if self._bar is not None:
            self._bar.set_description_str(f"{self.desc} ({self.failed} failed)", refresh=False)
        self.update(n)

    def _print_line(self) -> None:
        self._logged_count = self.count
        print(self.line(), file=self.stream, flush=True)

    def line(self) -> str:
        now = time.time()
        elapsed = now - self.started
        done = f"{self.count - self.failed}/{self.total}" if self.total else f"{self.count - self.failed}"
        eta = ""
        if self.total and self.count:
            eta = f", ETA {format_duration(elapsed / self.count * (self.total - self.count))}"
        failed = f" ({self.failed} failed)" if self.failed else ""
        return (
            f"{timestamp(now)} [{self.desc}] {done} {self.unit}{failed}, {self._rates()}{eta}, "
            f"{format_duration(elapsed)} elapsed"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._logged_count is not None and self._logged_count != self.count:
            self._print_line()
