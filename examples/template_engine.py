"""The smallest engine the bench can time: a template to copy when you put your own engine behind
the contract (docs/engine-template.md walks through it).

It is honest, not a mock: a real (tiny) JAX model, the GRPO clipped surrogate over the completion
tokens, gradients accumulated over a step's micro-batches and one AdamW update per step. What it
leaves out on purpose is marked where it would go: the model has no attention (each position sees
only its own token), there is no KL term, no sharding over a mesh (one device) and none of the
contract's optional methods (`OPTIONAL_METHODS` in rl_trainer_bench/engine/contract.py).

It imports only the contract from the bench, as your engine should: the bench builds it as
`TemplateEngine(config)` from the ENGINE knob's `module:Class` and calls nothing but the contract.

    PYTHONPATH=examples rl-trainer-bench check-engine --engine template_engine:TemplateEngine
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_trainer_bench.engine.contract import Payload

# The micro-batch arrays this engine reads; the payload may carry more (ref_logps, routes).
INPUTS = ("input_ids", "segment_ids", "completion_mask", "advantages", "old_logps")


def init_parameters(key: jax.Array, vocab_size: int, width: int) -> dict[str, jax.Array]:
    """Embedding, one residual MLP layer and the output head, scaled so logits start near 0."""
    k_embed, k_hidden, k_head = jax.random.split(key, 3)
    scale = width**-0.5
    return {
        "embed": jax.random.normal(k_embed, (vocab_size, width), jnp.float32) * scale,
        "hidden": jax.random.normal(k_hidden, (width, width), jnp.float32) * scale,
        "head": jax.random.normal(k_head, (width, vocab_size), jnp.float32) * scale,
    }


def token_logps(params: Mapping[str, jax.Array], input_ids: jax.Array) -> jax.Array:
    """[B, T] log-probability at position t of token t+1 (the contract's input-aligned scoring).

    Your model goes here: attention over each packed segment (`segment_ids`, `positions`) is what
    this template leaves out. The last position's target wraps around; the completion mask is 0
    there (a sequence's last token has no target), so it never reaches the loss.
    """
    hidden = params["embed"][input_ids]
    hidden = hidden + jnp.tanh(hidden @ params["hidden"])
    logps = jax.nn.log_softmax(hidden @ params["head"], axis=-1)
    targets = jnp.roll(input_ids, -1, axis=1)
    return jnp.take_along_axis(logps, targets[..., None], axis=-1)[..., 0]


def surrogate_sum(params, batch, epsilon: float, epsilon_high: float) -> jax.Array:
    """The GRPO clipped surrogate summed over the completion tokens (the mean is taken per step)."""
    mask = batch["completion_mask"].astype(jnp.float32)
    ratio = jnp.exp(token_logps(params, batch["input_ids"]) - batch["old_logps"])
    advantages = batch["advantages"]
    clipped = jnp.clip(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    per_token = -jnp.minimum(ratio * advantages, clipped * advantages)
    return jnp.sum(per_token * mask)


class TemplateEngine:
    """The contract's required calls (`compile`, `fwd_bwd`, `update`, `get_metrics`, `train_step`)
    over a tiny JAX model; the step's loss is the token mean over all its micro-batches."""

    def __init__(self, config) -> None:
        self.config = config
        self._device = jax.devices()[0]
        model, optimizer = config.model, config.optimizer
        self._params = init_parameters(jax.random.key(config.seed), model.vocab_size, model.d_model)
        self._optimizer = optax.chain(
            optax.clip_by_global_norm(optimizer.max_grad_norm),
            optax.adamw(
                optimizer.learning_rate,
                b1=optimizer.b1,
                b2=optimizer.b2,
                eps=optimizer.eps,
                weight_decay=optimizer.weight_decay,
            ),
        )
        self._opt_state = self._optimizer.init(self._params)
        self._accumulated = self._empty_accumulator()
        self._programs: dict[str, Any] = {}
        self._metrics: dict[str, Any] | None = None
        self._train_step = 0

    @property
    def train_step(self) -> int:
        return self._train_step

    def _empty_accumulator(self) -> dict[str, Any]:
        """The step's running sums: gradient, surrogate, completion tokens, real tokens."""
        return {
            "grads": jax.tree.map(jnp.zeros_like, self._params),
            "loss": jnp.zeros((), jnp.float32),
            "denominator": jnp.zeros((), jnp.float32),
            "tokens": jnp.zeros((), jnp.int32),
        }

    def _fwd_bwd(self, params, accumulated, batch):
        loss = self.config.loss
        value, grads = jax.value_and_grad(surrogate_sum)(
            params, batch, loss.epsilon, loss.epsilon_high
        )
        return {
            "grads": jax.tree.map(jnp.add, accumulated["grads"], grads),
            "loss": accumulated["loss"] + value,
            "denominator": accumulated["denominator"] + jnp.sum(batch["completion_mask"]),
            "tokens": accumulated["tokens"] + jnp.sum(batch["segment_ids"] != 0, dtype=jnp.int32),
        }

    def _update(self, params, opt_state, accumulated):
        """The token mean: the summed gradient divided by the step's completion tokens; the sums
        come back zeroed, in the buffers they were donated in, for the next step."""
        denominator = jnp.maximum(accumulated["denominator"], 1.0)
        grads = jax.tree.map(lambda g: g / denominator, accumulated["grads"])
        updates, opt_state = self._optimizer.update(grads, opt_state, params)
        metrics = {
            "loss": accumulated["loss"] / denominator,
            "grad_norm": optax.tree.norm(grads),
            "loss_denominator": accumulated["denominator"],
            "tokens": accumulated["tokens"],
        }
        zeroed = jax.tree.map(jnp.zeros_like, accumulated)
        return optax.apply_updates(params, updates), opt_state, zeroed, metrics

    def compile(self, example: Payload) -> dict[str, float]:
        """Compile both programs ahead of time for micro-batches shaped like `example`."""
        batch = self._device_batch(example)
        jobs = {
            "fwd_bwd": (self._fwd_bwd, (self._params, self._accumulated, batch), (1,)),
            "update": (self._update, (self._params, self._opt_state, self._accumulated), (0, 1, 2)),
        }
        seconds = {}
        for name, (function, args, donated) in jobs.items():
            start = time.perf_counter()
            self._programs[name] = jax.jit(function, donate_argnums=donated).lower(*args).compile()
            seconds[name] = time.perf_counter() - start
        return seconds

    def _device_batch(self, payload: Payload) -> dict[str, jax.Array]:
        arrays = payload.arrays()
        return {name: jax.device_put(np.asarray(arrays[name]), self._device) for name in INPUTS}

    def fwd_bwd(self, batch: Payload) -> None:
        """Dispatch one micro-batch's forward and backward; its gradient adds into the step's."""
        if not self._programs:
            raise RuntimeError("fwd_bwd before compile(example): compile first")
        self._accumulated = self._programs["fwd_bwd"](
            self._params, self._accumulated, self._device_batch(batch)
        )

    def update(self) -> int:
        """Apply the step's gradient, start the next step's sums, and count the step."""
        self._params, self._opt_state, self._accumulated, metrics = self._programs["update"](
            self._params, self._opt_state, self._accumulated
        )
        self._train_step += 1
        self._metrics = metrics
        return self._train_step

    def get_metrics(self, clear_cache: bool = True) -> dict[str, Any]:
        """Host values of the last update (empty before the first); clear_cache forgets them.

        The MoE counters are None: this engine has no experts, and a figure it did not count is
        never reported as 0.
        """
        if self._metrics is None:
            return {}
        device = jax.device_get(self._metrics)
        out = {name: float(device[name]) for name in ("loss", "grad_norm", "loss_denominator")}
        out |= {"tokens": int(device["tokens"]), "train_step": self._train_step}
        out |= {"overflow_count": None, "replay_count": None, "mult_prob_error_max": None}
        if clear_cache:
            self._metrics = None
        return out
