"""The A/B's per-step model, fitted so that one stray step cannot move it: a Huber regression.

A sequential A/B (sequential.py) reads every scored step as a datum: step time = the baseline's
level + one effect per other setting + a drift linear in the run + noise. The drift costs one
parameter, not one per half-block, so a look after k half-blocks of one-step turns has 2k - 3
degrees of freedom left for the noise, where a difference per half-block leaves k - 1.

Least squares would let one step several percent off (a host hiccup, a garbage collection) pull
the effect and, worse, the spread: on the chip one turn of 2155 ms among eleven of 2047-2069 ms
made every later interval too wide to settle. So the fit is Huber's M-estimate (Huber, Ann. Math.
Statist. 35:73, 1964; tuning constant 1.345, 95% as efficient as least squares on normal noise):
each step's residual counts in full up to 1.345 scales and only that much beyond, the scale being
the median absolute residual over 0.6745, re-estimated at every reweighting (iteratively
reweighted least squares, a fixed number of rounds so the same steps always give the same fit). A
step more than SET_ASIDE scales from that fit is then set aside and the fit made again without it.
A short look needs one more guard: with 6 steps for 3 parameters least squares, the fit's start,
spreads a stray step over the others, and Huber's fit never sees it as far. So before the fit each
step is tested against a least-squares fit of the others (`stray_step`), and the one step that
fails is left out.
The effect's standard error is the larger of two: least squares' at the fitted scale times
E[psi^2] / E[psi']^2 = 1.0525 (what normal noise gives Huber's estimate), and Huber's sandwich,
K^2 s^2 (sum psi^2 / (n - p)) / (mean psi')^2 (X'X)^-1, which grows where many residuals are
clipped (noise with heavier tails than normal, whose clipped steps still move the estimate).

The fit is equivariant: adding a constant, an effect or a drift to the steps shifts the estimates
by it and leaves the residuals alone, and scaling the steps scales the estimates and their errors.
So the studentised effect (estimate minus truth over its error) has one law for every true effect,
level, drift and noise of a given design, and sequential.py calibrates its looks' critical values
by simulating that law once. Numpy only (vectorised over many simulated runs at once): the plan
simulates with it and needs no scipy.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from rl_trainer_bench.ab import student_t

TUNING = 1.345
ROUNDS = 30  # reweightings: from least squares to the M-estimate within 1e-6 of a scale
# A step this many scales from the fit is set aside (at 2 or more degrees of freedom left): a host
# hiccup of a few percent of a 0.2%-noise step lies far beyond it, normal noise in 0.2-0.4% of looks
# of 8-16 steps (the scale is estimated from few steps; the intervals' levels, simulated with it,
# hold: benchmarks/reports/ab-sequential-per-step_simulated_2026-12-06.md). Huber's fit alone keeps
# such a step's pull on the effect to 1.345 scales but lets it raise the scale by a tenth or more
# (it spends 1.81 of the n - p that the clipped residuals share); set aside, it costs one degree of
# freedom and nothing else.
SET_ASIDE = 5.0
# The chance that normal noise has `stray_step` set a step aside, at one look. At 1% the false
# claims over all looks rose from 0.85% to 1.5% of simulated runs (a step set aside from normal
# noise shrinks the scale); at 0.1%, 0.9% (4,000 runs each). The first look's threshold is then
# 77 deleted residuals (2 degrees of freedom): the chip's stray step stood at 346.
STRAY_LEVEL = 0.001
# E[psi(Z)^2] for standard normal Z: 2 Phi(c) - 1 - 2 c phi(c) + 2 c^2 (1 - Phi(c)) at c = TUNING
_PSI_SQUARED = 0.7101
_EFFICIENCY = _PSI_SQUARED / 0.8214**2  # over E[psi'(Z)]^2 = (2 Phi(c) - 1)^2


def design(setting_index: Sequence[int], settings: int) -> np.ndarray:
    """The regressors of steps in run order, each its setting's index (0: the baseline): a
    constant, one indicator per other setting, and the step's place in the run (centred, in
    steps: the run's busy clock when steps are alike, so a drift per step)."""
    index = np.asarray(setting_index)
    place = np.arange(len(index), dtype=np.float64)
    columns = [np.ones(len(index))]
    columns += [(index == s).astype(np.float64) for s in range(1, settings)]
    columns.append(place - place.mean())
    return np.column_stack(columns)


@dataclasses.dataclass(frozen=True)
class Fit:
    """The fit of every run (row) at once: coefficients and their standard errors (runs x p), the
    noise's scale and the degrees of freedom left (runs), and the steps set aside (runs x n)."""

    beta: np.ndarray
    errors: np.ndarray
    scale: np.ndarray
    df: np.ndarray
    set_aside: np.ndarray


def fit(x: np.ndarray, y: np.ndarray) -> Fit:
    """Huber's M-estimate of y on the regressors x (n x p), for every row of y (runs x n) at once,
    without a stray step that each step's own outlier test finds (`stray_step`), then again
    without the steps beyond SET_ASIDE scales, where there are any and at least two degrees of
    freedom remain without them."""
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    n, p = x.shape
    stray = stray_step(x, y)
    beta, scale = _huber(x, y, ~stray)
    far = stray | (np.abs(y - beta @ x.T) > SET_ASIDE * scale[:, None])
    far &= (n - far.sum(axis=1) - p >= 2)[:, None] | stray
    rows = np.flatnonzero((far & ~stray).any(axis=1))
    if rows.size:
        beta[rows], scale[rows] = _huber(x, y[rows], ~far[rows])
    keep = (~far).astype(np.float64)
    inverse = np.linalg.inv(np.einsum("np,rn,nq->rpq", x, keep, x))
    diagonal = np.diagonal(inverse, axis1=1, axis2=2)
    # The estimate's variance: the least-squares variance at the fitted scale times the larger of
    # E[psi^2] / E[psi']^2 (1.0525: normal noise) and the sandwich's factor. The sandwich alone ran
    # 1.2-1.5 times past its nominal level at a single look on normal steps (it estimates its
    # factor from few steps), the normal model alone past it on a series with a stray step in 24.
    residual = (y - beta @ x.T) * keep
    kept, df = keep.sum(axis=1), n - far.sum(axis=1) - p
    u = residual / scale[:, None]
    psi = np.clip(u, -TUNING, TUNING)
    inside = np.maximum(np.sum(keep * (np.abs(u) <= TUNING), axis=1) / kept, 1.0 / kept)
    factor = 1 + p / kept * (1 - inside) / inside  # Huber's small-sample factor (1981, 7.6)
    sandwich = (factor / inside) ** 2 * np.sum(psi * psi, axis=1) / df
    scale = np.where(np.any(residual != 0, axis=1), scale, 0.0)  # a perfect fit: no spread
    errors = scale[:, None] * np.sqrt(np.maximum(_EFFICIENCY, sandwich)[:, None] * diagonal)
    return Fit(beta, errors, scale, df, far)


def stray_step(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The one step per run (runs x n, True there) that the outlier test of each step against a
    least-squares fit of the others finds, if any: its deleted studentised residual (Cook and
    Weisberg, Residuals and Influence in Regression, 1982, 2.2) past Student's t at 1 - STRAY_LEVEL
    / 2n, Bonferroni over the n steps, so normal noise sets a step aside in at most STRAY_LEVEL of
    looks. Huber's fit alone cannot see such a step in a short look: at the first look, 6 steps for
    3 parameters, every step has leverage 0.5 on average and least squares (the fit's start) spreads
    a stray step over the others; on the chip one step 4.5% off read as noise of 2.32% there
    (benchmarks/reports/chip-round-2_tpu-v5e_2026-12-06.md). Tested only where two degrees of
    freedom remain without the step; Huber's fit then sets aside what lies beyond SET_ASIDE scales
    of the rest."""
    n, p = x.shape
    df = n - p - 1
    stray = np.zeros(y.shape, dtype=bool)
    if df < 2:
        return stray
    projection = x @ np.linalg.pinv(x)  # least squares' hat matrix: fitted = y @ projection.T
    hat = np.diagonal(projection)
    residual = y - y @ projection.T
    with np.errstate(divide="ignore", invalid="ignore"):
        # the others' variance: the residual sum of squares less the step's own share, over df
        others = (np.sum(residual * residual, axis=1)[:, None] - residual**2 / (1 - hat)) / df
        deleted = np.abs(residual) / np.sqrt(np.maximum(others, 0.0) * (1 - hat))
    deleted = np.where((hat < 1 - 1e-9) & np.isfinite(deleted), deleted, 0.0)
    worst = np.argmax(deleted, axis=1)
    found = deleted[np.arange(len(y)), worst] > _stray_quantile(n, df)
    stray[np.flatnonzero(found), worst[found]] = True
    return stray


@functools.lru_cache(maxsize=256)
def _stray_quantile(n: int, df: int) -> float:
    return student_t.t_quantile(1 - STRAY_LEVEL / (2 * n), df)


def _huber(x: np.ndarray, y: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Huber's M-estimate and its scale over the steps `keep` marks, by iteratively reweighted
    least squares from least squares."""
    kept = keep.astype(np.float64)
    df = kept.sum(axis=1) - x.shape[1]
    beta = _weighted_solve(x, y, kept)  # the start: least squares
    residual = (y - beta @ x.T) * kept
    scale = _nonzero(np.sqrt(np.sum(residual * residual, axis=1) / df))
    for _ in range(ROUNDS):
        psi = np.clip(residual / scale[:, None], -TUNING, TUNING)
        # Huber's proposal 2: the scale at which the clipped residuals have the spread that
        # normal noise gives them (n - p degrees of freedom)
        scale = _nonzero(scale * np.sqrt(np.sum(psi * psi, axis=1) / (df * _PSI_SQUARED)))
        u = residual / scale[:, None]
        weight = kept * np.minimum(1.0, TUNING / np.maximum(np.abs(u), 1e-300))
        beta = _weighted_solve(x, y, weight)
        residual = (y - beta @ x.T) * kept
    return beta, scale


def _weighted_solve(x: np.ndarray, y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Weighted least squares of every row of y on x, each row its own weights."""
    weighted = x[None, :, :] * weight[:, :, None]
    normal = np.einsum("rnp,nq->rpq", weighted, x)
    return np.linalg.solve(normal, np.einsum("rnp,rn->rp", weighted, y)[..., None])[..., 0]


def _nonzero(scale: np.ndarray) -> np.ndarray:
    """A scale of 0 (every residual 0: steps that repeat to the bit) taken as 1: every psi is then
    0, and so is the spread."""
    return np.where(scale > 0, scale, 1.0)
