"""The host clock of one step: when it started and ended, and a span around each trainer call in it.

The step loop wraps each call it times in `clock.span(name)`; the step record turns the spans into
the step's figures (`step_record.from_measurements`). Keeping the stamps here, apart from the loop,
keeps the loop readable as the trainer's calls and keeps the arithmetic in the step record, where
it is tested without a device. This module imports nothing heavy: the step record, which reads it,
is read by commands that never load JAX (`ab --from-logs`, the A/B's budget).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

Annotate = Callable[[str], contextlib.AbstractContextManager[object]]


class StepClock:
    """perf_counter seconds: the step's start and end, and (start, end) spans of named calls.

    `annotate` opens a profiler annotation around each span, so a trace and the ruler name the same
    intervals; the default opens none.
    """

    def __init__(self, annotate: Annotate = lambda _label: contextlib.nullcontext()):
        self._annotate = annotate
        self.start = 0.0
        self.end = 0.0
        self.spans: dict[str, list[tuple[float, float]]] = {}

    @contextlib.contextmanager
    def running(self) -> Iterator[StepClock]:
        """The step's own span: from its first dispatch to the last call inside the block."""
        self.start = time.perf_counter()
        yield self
        self.end = time.perf_counter()

    @contextlib.contextmanager
    def span(self, name: str, label: str | None = None) -> Iterator[None]:
        """Time the block as one more span of `name`; `label` names its profiler annotation."""
        with self._annotate(label or name):
            started = time.perf_counter()
            yield
            self.spans.setdefault(name, []).append((started, time.perf_counter()))

    def seconds(self, name: str) -> list[float]:
        """The durations of every `name` span, in order."""
        return [end - start for start, end in self.spans.get(name, ())]

    def starts(self, name: str) -> list[float]:
        return [start for start, _ in self.spans.get(name, ())]

    def ends(self, name: str) -> list[float]:
        return [end for _, end in self.spans.get(name, ())]
