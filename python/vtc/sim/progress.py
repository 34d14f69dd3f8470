"""A tiny progress bar on stderr, shown only for runs that take over a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Draw ``label [#####     ] 52%`` on one terminal line, at most 10 times a second.

    Nothing is drawn during the first ``delay`` seconds, so short runs stay
    silent; nothing at all when ``enabled`` is false (the default when
    ``stream`` is not a terminal, so logs get no carriage-return noise).
    """

    WIDTH = 30

    def __init__(
        self,
        label: str,
        total: int,
        *,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        delay: float = 1.0,
    ) -> None:
        self.label = label
        self.total = max(total, 1)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._start = time.monotonic()
        self._delay = delay
        self._next_draw = self._start + delay
        self._drawn = False

    def update(self, done: int) -> None:
        """Report ``done`` of ``total`` units finished; redraws if it is time to."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now < self._next_draw:
            return
        self._next_draw = now + 0.1
        self._draw(done, now)

    def close(self) -> None:
        """Finish the line if anything was drawn."""
        if self._drawn:
            self._draw(self.total, time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, done: int, now: float) -> None:
        frac = min(done / self.total, 1.0)
        filled = int(frac * self.WIDTH)
        bar = "#" * filled + " " * (self.WIDTH - filled)
        elapsed = now - self._start
        self.stream.write(f"\r{self.label} [{bar}] {frac:4.0%} {elapsed:5.1f}s")
        self.stream.flush()
        self._drawn = True
