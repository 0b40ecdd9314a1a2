"""Pre-registered predictions: the delta and band a user expects, written down before the run.

Writing the expected effect first keeps an A/B honest: a change that "helps by 2%" after the fact is
easy to believe, one that was predicted at -7.4% [-8.5, -5.5] and landed at -0.3% is not. A
prediction names two settings, `on-off=-7.4[-8.5,-5.5]`; the value and band are percent of the
second setting's median unless they end in `ms` or `s`. A prediction file (one per line, `#`
comments) is fingerprinted and its modification time compared with the run's start, so the report
can say whether it really was written before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rl_trainer_bench.errors import UserError

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_PREDICTION = re.compile(
    rf"^(?P<setting>[A-Za-z][A-Za-z0-9_.+]*)-(?P<baseline>[A-Za-z][A-Za-z0-9_.+]*)="
    rf"(?P<value>{_NUMBER})(?P<unit>%|ms|s)?\[(?P<low>{_NUMBER}),(?P<high>{_NUMBER})\]$"
)
_UNIT_SECONDS = {"ms": 1e-3, "s": 1.0}


@dataclasses.dataclass(frozen=True)
class Prediction:
    text: str
    setting: str
    baseline: str
    value: float
    low: float
    high: float
    unit: str  # "%" of the baseline's median, "ms" or "s"

    def measure(self, medians_s: Mapping[str, float]) -> float:
        """The measured delta in this prediction's unit, from per-setting median seconds."""
        delta_s = medians_s[self.setting] - medians_s[self.baseline]
        if self.unit == "%":
            return 100.0 * delta_s / medians_s[self.baseline]
        return delta_s / _UNIT_SECONDS[self.unit]


@dataclasses.dataclass(frozen=True)
class PredictionSource:
    """Where predictions came from: the command line, or a file with its fingerprint."""

    origin: str  # "--predict" or the file's path
    sha256: str | None = None
    modified_unix: float | None = None


def parse_prediction(text: str) -> Prediction:
    """Parse one `SETTING-BASELINE=VALUE[UNIT][LOW,HIGH]` prediction."""
    compact = text.replace(" ", "")
    match = _PREDICTION.match(compact)
    if not match:
        raise UserError(
            f"--predict {text!r}: write SETTING-BASELINE=VALUE[LOW,HIGH], e.g. on-off=-7.4[-8.5,-5.5] "
            "(percent of BASELINE's median; append ms or s to the value for absolute times)"
        )
    value, low, high = (float(match[k]) for k in ("value", "low", "high"))
    if not low <= high:
        raise UserError(
            f"--predict {text!r}: band [{low}, {high}] must be [LOW,HIGH] with LOW <= HIGH"
        )
    if match["setting"] == match["baseline"]:
        raise UserError(f"--predict {text!r}: name two different settings")
    return Prediction(
        compact, match["setting"], match["baseline"], value, low, high, match["unit"] or "%"
    )


def parse_predictions(texts: Iterable[str]) -> list[Prediction]:
    """Parse `--predict` values; each may hold several predictions separated by `;`."""
    return [parse_prediction(p) for text in texts for p in text.split(";") if p.strip()]


def read_prediction_file(path: Path) -> tuple[list[Prediction], PredictionSource]:
    """Predictions from a file, one per line, with the file's fingerprint."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"--predict-file {path}: cannot read it ({error.strerror})") from None
    lines = [line.split("#", 1)[0].strip() for line in data.decode("utf-8").splitlines()]
    predictions = parse_predictions(line for line in lines if line)
    if not predictions:
        raise UserError(
            f"--predict-file {path}: no predictions in it; write e.g. on-off=-7.4[-8.5,-5.5]"
        )
    source = PredictionSource(str(path), hashlib.sha256(data).hexdigest(), os.stat(path).st_mtime)
    return predictions, source


def check_settings(predictions: Iterable[Prediction], settings: Iterable[str]) -> None:
    """Refuse, before any device work, a prediction about a setting the run does not have."""
    known = list(settings)
    for prediction in predictions:
        for name in (prediction.setting, prediction.baseline):
            if name not in known:
                raise UserError(
                    f"--predict {prediction.text!r}: no setting {name!r} in the arms; "
                    f"the settings are {', '.join(known)}"
                )


def outcomes(
    predictions: Iterable[Prediction], medians_s: Mapping[str, float]
) -> list[dict[str, Any]]:
    """Each prediction with the measured value and whether it held (measured inside the band)."""
    results = []
    for prediction in predictions:
        measured = prediction.measure(medians_s)
        results.append(
            {
                **dataclasses.asdict(prediction),
                "measured": measured,
                "held": prediction.low <= measured <= prediction.high,
            }
        )
    return results
