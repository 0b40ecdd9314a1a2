"""What the A/B tells the terminal while it runs, and the driver's full log it keeps in ab.log."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rl_trainer_bench.bench import step_record
from rl_trainer_bench.io import refuse_special_file
from rl_trainer_bench.units import milliseconds


class Progress:
    """Progress on the terminal (elapsed, arm, step k of n); the driver's full log in ab.log.

    The driver's per-step ruler lines go to ab.log (where `--from-logs` can read them back); the
    terminal gets one short line per step instead. During an arm only the driver's other ruler lines
    (a recompile, say) reach the terminal; before the arms, everything does. Lines are held in
    memory until `keep_log` names the file, so a run refused during set-up leaves no file behind.
    """

    def __init__(self, started: float, echo: Callable[[str], None] = print):
        self._started, self._echo = started, echo
        self._file: TextIO | None = None
        self._held: list[str] = []
        self._arm, self._total, self._step = "", 0, 0

    def keep_log(self, path: Path) -> None:
        """From now on, write the log to `path` (created with its folder), held lines first."""
        refuse_special_file(path, "--out")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("w")
        for line in self._held:
            self._write(line)
        self._held = []

    @property
    def keeps_log(self) -> bool:
        """Whether the log goes to its file yet (`keep_log` was called)."""
        return self._file is not None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def say(self, message: str) -> None:
        line = f"[ab {time.time() - self._started:6.1f}s] {message}"
        self._echo(line)
        self._write(line)

    def start_arm(self, arm: str, total_steps: int) -> None:
        self._arm, self._total, self._step = arm, total_steps, 0
        self.say(f"arm {arm}: {total_steps} steps")

    def where(self) -> str:
        """Where the run is: in which arm, or still setting up."""
        return f"in arm {self._arm}" if self._arm else "while setting up"

    def log(self, line: str) -> None:
        self._write(line)
        if f"{step_record.LOG_PREFIX} step=" in line:
            self._step += 1
            record = step_record.parse_line(line)
            kind = "warm-up" if record.warmup else "scored"
            self._echo(
                f"[ab {time.time() - self._started:6.1f}s] arm {self._arm}: step {self._step} of "
                f"{self._total} ({kind}) {milliseconds(record.step_s, '.1f')} ms"
            )
        elif not self._arm or line.startswith(step_record.LOG_PREFIX):
            self._echo(line)

    def _write(self, line: str) -> None:
        if self._file is None:
            self._held.append(line)
            return
        self._file.write(line + "\n")
        self._file.flush()
