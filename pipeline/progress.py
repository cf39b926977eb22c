"""Progress for long work: a bar on a terminal, plain periodic log lines elsewhere (CI, batch jobs)."""

from __future__ import annotations

import sys
import time


class Progress:
    """`with Progress(total=n, unit="videos") as bar: bar.update(1, clips=30)`.

    Counts a main unit (with rate and ETA) and any number of extra counters (their rates shown too).
    Off a terminal it prints a line every `log_every_s` seconds, and on close the final count if it
    printed any line before: work shorter than the interval stays silent."""

    LOG_EVERY_S = 10.0

    def __init__(self, total: int | None, unit: str = "videos", desc: str = "", quiet: bool = False,
                 log_every_s: float | None = None, stream=None):
        self.total, self.unit, self.desc, self.quiet = total, unit, desc, quiet
        self.stream = stream or sys.stderr
        self.log_every_s = self.LOG_EVERY_S if log_every_s is None else log_every_s
        self._logged_count: int | None = None   # the count in the last line printed
        self.count = 0
        self.extra: dict[str, float] = {}
        self.started = time.time()
        self._last_log = self.started
        self._bar = None
        if not quiet and self.stream.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=total, unit=f" {unit}", desc=desc, file=self.stream, leave=False,
                             dynamic_ncols=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _rates(self) -> str:
        elapsed = max(time.time() - self.started, 1e-9)
        parts = [f"{self.count / elapsed:.3g} {self.unit}/s"]
        parts += [f"{value / elapsed:.3g} {name}/s" for name, value in self.extra.items()]
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

    def _print_line(self) -> None:
        self._logged_count = self.count
        print(self.line(), file=self.stream, flush=True)

    def line(self) -> str:
        elapsed = time.time() - self.started
        done = f"{self.count}/{self.total}" if self.total else f"{self.count}"
        eta = ""
        if self.total and self.count:
            eta = f", ETA {elapsed / self.count * (self.total - self.count):.0f}s"
        return f"[{self.desc}] {done} {self.unit}, {self._rates()}{eta}, {elapsed:.0f}s elapsed"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._logged_count is not None and self._logged_count != self.count:
            self._print_line()
