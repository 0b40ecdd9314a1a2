"""results.jsonl: one strict JSON line per step, written as the step ends, and read back."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from rl_trainer_bench.bench.step_record import LOG_PREFIX, StepRecord
from rl_trainer_bench.errors import UserError
from rl_trainer_bench.io import move_earlier_run_aside, refuse_special_file, write_text_atomically


class ResultsWriter:
    """Writes one JSON line per step to results.jsonl, flushed and synced before the next step,
    so a crash or a killed pod keeps every finished step.

    The file is opened only when the first step is written, and an earlier run's file there is
    then moved aside into `earlier-<time>/` (named in the log), never replaced or appended to: a
    run refused or failed before its first step leaves earlier results as they were. A write that
    fails (a full disk) cuts the file back to its last whole line, or removes it when it holds
    none, and stops the run with one line naming the file.
    """

    def __init__(
        self,
        path: Path,
        log: Callable[[str], None] = print,
        companions: Mapping[str, str] | None = None,
    ):
        """`companions`: files (name -> text) written atomically beside the results when the first
        step is, after an earlier run's are moved aside with its results (the plan the pod ran)."""
        self.path = path
        self._log = log
        self._companions = dict(companions or {})
        self._file: IO[str] | None = None
        self._lines = 0

    def write(self, record: StepRecord) -> None:
        line = json.dumps(record.to_json(), allow_nan=False) + "\n"
        if self._file is None:
            self._open()
        end = self._file.tell()
        try:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as error:
            self._cut_back(end)
            kept = f"the {self._lines} step(s) before are kept" if self._lines else "none kept"
            raise UserError(
                f"cannot write {self.path} ({error.strerror or error}): free space there or set"
                f" another RESULTS_DIR; {kept}"
            ) from None
        self._lines += 1

    def _open(self) -> None:
        refuse_special_file(self.path, "RESULTS_DIR")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        aside = move_earlier_run_aside(self.path.parent, [self.path.name, *self._companions])
        if aside is not None:
            self._log(f"{LOG_PREFIX} moved the earlier {self.path.name} aside to {aside}")
        for name, text in self._companions.items():
            write_text_atomically(self.path.parent / name, text)
        self._file = self.path.open("w", encoding="utf-8")

    def _cut_back(self, end: int) -> None:
        """Leave only whole lines: truncate to `end`, or remove a file with no line at all."""
        with contextlib.suppress(OSError):
            self._file.truncate(end)
            self._file.close()
        if not self._lines:
            with contextlib.suppress(OSError):
                self.path.unlink()
        self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_results(path: Path) -> list[StepRecord]:
    """The records of a results.jsonl (a torn last line, from a crash, is skipped). A line of
    JSON that is no object (a list, a string: another file's text) is a TypeError naming it, as
    an object missing a record's fields is."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict):
            raise TypeError(f"{path} line {number}: {type(data).__name__}, not a step's record")
        records.append(StepRecord.from_json(data))
    return records
