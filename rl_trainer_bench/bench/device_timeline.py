"""Device timeline: when each dispatched program's result became ready, stamped off the host's path.

Dispatch is asynchronous, so the host's clock says when work was *queued*, not when the device did
it. A watcher thread takes each completion marker in FIFO order, blocks on it, and stamps
`time.perf_counter()` when it is ready; the dispatching thread only appends to a queue and never
waits. The stamps give each program's device seconds and the device's idle gap at a step boundary.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import jax


class DeviceTimeline:
    """A FIFO of (label, marker) that a daemon thread turns into (label, ready time) stamps.

    `marker` is anything `jax.block_until_ready` accepts (an array, or a pytree of arrays). One
    device runs its programs in order, so FIFO waiting stamps each one within the thread's wake-up
    latency of its real completion; a marker that is ready late holds back the stamps after it,
    which can only make later stamps late, never early.
    """

    def __init__(self, name: str = "device-timeline"):
        self._pending: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._stamps: dict[str, float] = {}
        self._errors: list[BaseException] = []
        self._done = threading.Condition()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    def watch(self, label: str, marker: Any) -> None:
        """Queue `marker` to be stamped as `label` when ready; returns at once."""
        self._pending.put((label, marker))

    def _watch(self) -> None:
        while (item := self._pending.get()) is not None:
            label, marker = item
            try:
                jax.block_until_ready(marker)
            except BaseException as error:  # reported by the next `ready` call
                self._errors.append(error)
            stamp = time.perf_counter()
            with self._done:
                self._stamps[label] = stamp
                self._done.notify_all()

    def ready(self, label: str, timeout: float | None = None) -> float:
        """The ready stamp of `label`, waiting for the watcher to reach it."""
        with self._done:
            if not self._done.wait_for(lambda: label in self._stamps, timeout):
                raise TimeoutError(f"device timeline: {label} not ready after {timeout} s")
            if self._errors:
                raise RuntimeError(f"device timeline: waiting on {label} failed") from (
                    self._errors[0]
                )
            return self._stamps[label]

    def forget(self) -> None:
        """Drop every stamp taken so far (labels repeat from step to step)."""
        with self._done:
            self._stamps.clear()

    def close(self) -> None:
        self._pending.put(None)
        self._thread.join()
