"""The sequential A/B's per-step fit (ab/robust_fit.py): a level, the effect and a linear drift,
Huber's M-estimate with a stray step set aside, checked against least squares (numpy's lstsq, an
independent reference) where no step is far from the fit, and against figures worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from rl_trainer_bench.ab import robust_fit

ORDER = [0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1]  # ABBA BAAB ABBA BAAB, 1-step turns


def test_the_design_is_a_level_an_indicator_per_other_setting_and_the_centred_place():
    x = robust_fit.design([0, 1, 2, 2, 1, 0], 3)
    assert x.tolist() == [
        [1, 0, 0, -2.5],
        [1, 1, 0, -1.5],
        [1, 0, 1, -0.5],
        [1, 0, 1, 0.5],
        [1, 1, 0, 1.5],
        [1, 0, 0, 2.5],
    ]


def test_it_recovers_a_level_an_effect_and_a_drift_exactly():
    x = robust_fit.design(ORDER, 2)
    y = 2.06 + 0.02 * np.array(ORDER) + 0.001 * (np.arange(16) - 7.5)
    fitted = robust_fit.fit(x, y)
    assert fitted.beta[0] == pytest.approx([2.06, 0.02, 0.001], abs=1e-9)
    assert fitted.scale[0] < 1e-12 and fitted.errors[0] == pytest.approx([0, 0, 0], abs=1e-9)
    assert fitted.df[0] == 13 and not fitted.set_aside.any()


def test_without_a_far_step_it_solves_huber_s_equations():
    """Normal noise, no step far out: the estimate solves Huber's estimating equations (the
    clipped residuals sum to 0 against every regressor, and their squares to (n - p) E[psi^2] =
    13 x 0.7101, Huber's proposal 2), lies within a fifth of a standard error of least squares
    (numpy's lstsq), and its standard error is the least-squares formula's at the fitted scale
    times sqrt(1.0525), Huber's efficiency at 1.345 (here above the sandwich's factor)."""
    rng = np.random.default_rng(4)
    x = robust_fit.design(ORDER, 2)
    y = 2.06 + 0.004 * rng.standard_normal(16)
    fitted = robust_fit.fit(x, y)
    u = (y - x @ fitted.beta[0]) / fitted.scale[0]
    psi = np.clip(u, -1.345, 1.345)
    assert np.abs(psi).max() == 1.345  # some residual is clipped: not least squares
    assert x.T @ psi == pytest.approx([0, 0, 0], abs=1e-6)
    assert np.sum(psi * psi) == pytest.approx(13 * 0.7101, rel=1e-6)
    ols = np.linalg.lstsq(x, y, rcond=None)[0]
    inverse = np.linalg.inv(x.T @ x)[1, 1]
    assert abs(fitted.beta[0, 1] - ols[1]) < 0.2 * fitted.errors[0, 1]
    assert fitted.errors[0, 1] == pytest.approx(
        fitted.scale[0] * np.sqrt(1.0525 * inverse), rel=1e-3
    )


def test_a_step_several_percent_off_is_set_aside_and_costs_one_degree_of_freedom():
    """One step of 2155 ms among steps of 2058 ms and 4 ms noise (the chip's stray turn): the fit
    is the fit of the other 15 steps, least squares over them; least squares over all 16 would
    move the effect by 6 ms."""
    rng = np.random.default_rng(8)
    x = robust_fit.design(ORDER, 2)
    y = 2.058 + 0.004 * rng.standard_normal(16)
    stray = y.copy()
    stray[5] = 2.155
    fitted = robust_fit.fit(x, stray)
    assert fitted.set_aside[0].tolist() == [i == 5 for i in range(16)]
    assert fitted.df[0] == 12
    kept = np.arange(16) != 5
    clean = robust_fit.fit(x[kept], y[kept])
    assert fitted.beta[0] == pytest.approx(clean.beta[0], abs=1e-9)
    assert fitted.errors[0, 1] == pytest.approx(clean.errors[0, 1], rel=0.2)
    moved = np.linalg.lstsq(x, stray, rcond=None)[0][1] - np.linalg.lstsq(x, y, rcond=None)[0][1]
    assert abs(moved) > 0.006


def test_many_runs_are_fitted_at_once_each_as_alone():
    rng = np.random.default_rng(2)
    x = robust_fit.design(ORDER, 2)
    y = rng.standard_normal((5, 16))
    y[2, 3] += 40.0
    together = robust_fit.fit(x, y)
    for row in range(5):
        alone = robust_fit.fit(x, y[row])
        assert together.beta[row] == pytest.approx(alone.beta[0], abs=1e-12)
        assert together.errors[row] == pytest.approx(alone.errors[0], abs=1e-12)
    assert together.set_aside.any(axis=1).tolist() == [False, False, True, False, False]


def test_where_many_steps_are_clipped_the_error_is_huber_s_sandwich():
    """Noise with heavy tails (Student's t, 2 degrees of freedom): more residuals are clipped
    than normal noise clips, and the error follows Huber's sandwich, worked here by hand from the
    fit's residuals, where it is the larger."""
    rng = np.random.default_rng(3)
    x = robust_fit.design(ORDER, 2)
    y = 2.06 + 0.004 * rng.standard_t(2, 16)
    fitted = robust_fit.fit(x, y)
    kept = ~fitted.set_aside[0]
    u = (y - x @ fitted.beta[0])[kept] / fitted.scale[0]
    psi = np.clip(u, -1.345, 1.345)
    inside = np.mean(np.abs(u) <= 1.345)
    n, df = kept.sum(), fitted.df[0]
    factor = (1 + 3 / n * (1 - inside) / inside) / inside
    sandwich = factor**2 * np.sum(psi * psi) / df
    assert sandwich > 1.0525
    inverse = np.linalg.inv(x[kept].T @ x[kept])[1, 1]
    by_hand = fitted.scale[0] * np.sqrt(sandwich * inverse)
    assert fitted.errors[0, 1] == pytest.approx(by_hand, rel=1e-9)
