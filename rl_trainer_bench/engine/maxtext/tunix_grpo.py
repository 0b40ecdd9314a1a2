"""Tunix's side of a MaxText trainer: its `TrainerWorker` and its GRPO loss, where installed.

A Tunix trainer with `--trainer_backend=maxtext` drives MaxText's `MaxTextTrainingEngine` through
Tunix's `TrainerWorker` (`tunix/experimental/worker/trainer_worker.py`) with Tunix's
`algo_core.grpo_loss_fn`, set as the public distributed GRPO example sets it: `with_loss_fn(loss,
has_aux=True)` and an input hook returning `train_example`, `algo_config`, `pad_id`, `eos_id`.
This module holds what the MaxText adapter needs to do the same (how MaxText's model splits into
hidden states and an output head is `maxtext.head`'s):

- **Driver choice** (`MAXTEXT_DRIVERS`, `choose`): `tunix` when the worker and the loss import,
  `maxtext` (the adapter's own calls and MaxText's router-replay loss) otherwise, or as asked.
- **The micro-batch** (`to_train_example`): Tunix's packed layout, the whole row as the
  completion behind a zero-width prompt, with segment ids and positions. Tunix's per-token
  log-probs are *token*-aligned (`compute_per_token_logps` pads position 0: logp[t] scores token
  t), the bench's arrays input-aligned (position t scores token t+1, `contract.Payload`), so the
  mask, the advantages and both log-prob arrays move right by one position. With
  `loss_agg_mode=token-mean` the loss denominator is then the mask's sum: the bench's count.
- **The loss config** (`grpo_config`): Tunix's `GRPOConfig` from the engine config's loss fields:
  epsilon, epsilon_high, beta, the k3 KL (`low_var_kl`), token-mean, temperature 1.
- **Replayed routes**: Tunix's log-prob pass calls the model with tokens, positions and segment
  ids only. The loss gets the rollout's routes as one more keyword argument and calls Tunix's
  loss on a model whose call adds them as MaxText's `forced_routed_experts` (`api.replaying`),
  so the expert load is the calibrated one, as on the adapter's own path.
- **Chunked log-prob pass** (`chunked_pass`): with `compute_logps_chunk_size` > 0 the loss runs
  Tunix's own chunked pass, as the trainer does, where the MaxText in use gives hidden states and
  an output head (`maxtext_head.head_split`: the model's own `skip_lm_head`, or around its
  decoder); the route-replaying call takes `skip_lm_head` and has `compute_final_logits` for it.
  Otherwise the full [B, T, V] logits are computed, and `info()` says why. That pass is also where
  a Tunix that has it reads `TUNIX_LOGPS_SHARDED_HEAD` (the trainer's sharded output head), from
  the pod's environment, which carries the trainer's: `sharded_head` says whether this Tunix does.

Tunix (and flax) are imported when `load_tunix` runs, never when this module is.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rl_trainer_bench.engine.config import LossConfig
from rl_trainer_bench.engine.contract import ContractError, Payload
from rl_trainer_bench.engine.maxtext import head as maxtext_head

TUNIX = "tunix"  # Tunix's TrainerWorker and GRPO loss
MAXTEXT = "maxtext"  # the adapter's own calls with MaxText's router-replay loss
AUTO = "auto"  # Tunix's where importable
MAXTEXT_DRIVERS = (AUTO, TUNIX, MAXTEXT)
# The files of Tunix the driver imports, relative to the package: looked for without importing.
TUNIX_FILES = ("experimental/worker/trainer_worker.py", "rl/algo_core.py")
# Read by Tunix only on unpadded rows (packed rows carry segment ids); the bench's padding token.
PAD_ID = 0
EOS_ID = 0
LOSS_AGG_MODE = "token-mean"
KL_LOSS_MODE = "low_var_kl"  # (r - 1) - log r: the built-in engine's k3
# The engine config's loss fields Tunix's GRPO config takes (MaxText's router-replay loss does not).
TAKEN_LOSS_FIELDS = ("loss.epsilon", "loss.epsilon_high", "loss.beta")
# The variable through which the trainer's Tunix chooses its chunked pass's output head.
SHARDED_HEAD_VARIABLE = "TUNIX_LOGPS_SHARDED_HEAD"
# Where Tunix's log-prob pass lives, relative to the package: read for that variable, not imported.
LOGPS_FILES = ("rl/common.py", "rl/algo_core.py")


@dataclasses.dataclass(frozen=True)
class ChunkedPass:
    """Whether the loss's log-probs go through Tunix's chunked pass: its chunk (0: the full
    logits) and how, or why not."""

    chunk_size: int
    how: str

    def describe(self) -> str:
        if self.chunk_size:
            return f"applied, chunk {self.chunk_size}, via {self.how}"
        return f"not applied: {self.how}"


def chunked_pass(split: maxtext_head.HeadSplit, chunk_size: int) -> ChunkedPass:
    """The pass the loss runs for `compute_logps_chunk_size` on a model with `split`."""
    if split.kind == maxtext_head.NONE:
        return ChunkedPass(
            0,
            f"compute_logps_chunk_size={chunk_size} is not applied: {split.why}; the full"
            " [B, T, V] logits are computed, more device memory than the trainer's pass",
        )
    return ChunkedPass(chunk_size, split.why)


def planned_chunked_pass(chunk_size: int) -> str:
    """What the plan can say before the pod: the split is the image's MaxText's to offer."""
    return (
        f"checked in the pod: chunk {chunk_size} through Tunix's own chunked pass where the image's"
        " MaxText gives hidden states and an output head (its model's own skip_lm_head, or around"
        " its decoder, as maxtext 0.2.5's allows), else the full [B, T, V] logits; the engine's"
        " info (chunked_logps) says which ran"
    )


def sharded_head(chunked: ChunkedPass) -> str:
    """Whether this Tunix's chunked pass reads SHARDED_HEAD_VARIABLE (found in its files, not
    imported), so that the trainer's value, which the pod's environment carries, takes effect."""
    spec = importlib.util.find_spec(TUNIX)
    if spec is None or not spec.submodule_search_locations:
        return "-"
    root = Path(next(iter(spec.submodule_search_locations)))
    readers = [
        name
        for name in LOGPS_FILES
        if (root / name).is_file() and SHARDED_HEAD_VARIABLE in (root / name).read_text()
    ]
    if not readers:
        return f"this Tunix does not read {SHARDED_HEAD_VARIABLE}: its chunked pass has one head"
    if not chunked.chunk_size:
        return (
            f"this Tunix reads {SHARDED_HEAD_VARIABLE} ({', '.join(readers)}), but only in the"
            " chunked pass, which does not run"
        )
    return (
        f"this Tunix reads {SHARDED_HEAD_VARIABLE} ({', '.join(readers)}) in the chunked pass that"
        " runs: the head the pod's environment names (the trainer's value) runs"
    )


@dataclasses.dataclass(frozen=True)
class TunixApi:
    """The Tunix names the adapter uses, resolved once: the real package or a stand-in."""

    worker_type: type  # TrainerWorker(trainer_factory, worker_id=...)
    grpo_loss_fn: Callable[..., Any]  # algo_core.grpo_loss_fn
    train_example_type: type  # rl.common.TrainExample
    grpo_config_type: type  # rl.grpo.grpo_learner.GRPOConfig
    # (model, routes or None, wrapped, head split kind) -> a model with Tunix's call that replays
    # the routes (`ReplayingCall`); `wrapped`: the engine's model is MaxText's TunixMaxTextAdapter,
    # else its bare Transformer.
    replaying: Callable[[Any, Any, bool, str], Any]


@dataclasses.dataclass(frozen=True)
class RoutedExample:
    """What the worker's `fwd_bwd` is given: Tunix's TrainExample and the rollout's routes."""

    train_example: Any
    routed_experts: np.ndarray | None


def tunix_absent() -> str | None:
    """Why Tunix's worker or loss cannot be imported here, or None (found without importing)."""
    spec = importlib.util.find_spec(TUNIX)
    if spec is None or not spec.submodule_search_locations:
        return "tunix is not installed"
    root = Path(next(iter(spec.submodule_search_locations)))
    missing = [name for name in TUNIX_FILES if not (root / name).is_file()]
    return f"this tunix lacks {', '.join(missing)}" if missing else None


def choose(driver: str, load: Callable[[], TunixApi]) -> tuple[TunixApi | None, str]:
    """(Tunix's API or None for the adapter's own calls, why) for the MAXTEXT_DRIVER value."""
    if driver == MAXTEXT:
        return None, "MAXTEXT_DRIVER=maxtext"
    try:
        return load(), f"MAXTEXT_DRIVER={driver}, Tunix importable"
    except ImportError as error:
        if driver == TUNIX:
            raise ContractError(
                f"MAXTEXT_DRIVER=tunix needs Tunix's TrainerWorker and GRPO loss importable"
                f" ({error}): put a Tunix checkout with tunix/experimental on PYTHONPATH, or set"
                " MAXTEXT_DRIVER=maxtext"
            ) from error
        return None, f"MAXTEXT_DRIVER=auto and Tunix is not importable ({error})"


def load_tunix() -> TunixApi:
    """The installed Tunix's worker, loss, example and config types (ImportError when absent)."""
    # Tunix: optional, and the knob table reads this module on every command
    from tunix.experimental.worker.trainer_worker import TrainerWorker
    from tunix.rl.algo_core import grpo_loss_fn
    from tunix.rl.common import TrainExample
    from tunix.rl.grpo.grpo_learner import GRPOConfig

    return TunixApi(TrainerWorker, grpo_loss_fn, TrainExample, GRPOConfig, _replaying_call())


def grpo_config(api: TunixApi, loss: LossConfig) -> Any:
    """Tunix's GRPOConfig for the engine config's loss. `epsilon_high` and `temperature` are read
    by the loss but are not fields of it; they are set on it, as Tunix's GRPO learner sets
    `temperature`."""
    config = api.grpo_config_type(
        beta=loss.beta,
        epsilon=loss.epsilon,
        loss_agg_mode=LOSS_AGG_MODE,
        kl_loss_mode=KL_LOSS_MODE,
    )
    config.epsilon_high = loss.epsilon_high
    config.temperature = 1.0
    return config


def token_aligned(array: np.ndarray) -> np.ndarray:
    """An input-aligned [B, T] array token-aligned: moved right by one position, 0 first.

    A segment's last position never scores (no next token), so nothing crosses into the next
    segment's first position.
    """
    shifted = np.zeros_like(array)
    shifted[:, 1:] = array[:, :-1]
    return shifted


def to_train_example(payload: Payload, api: TunixApi) -> RoutedExample:
    """The bench's micro-batch as Tunix's packed TrainExample (module docstring: alignment)."""
    rows, tokens = payload.shape
    empty = np.zeros((rows, 0), np.int32)
    example = api.train_example_type(
        prompt_ids=empty,
        prompt_mask=empty,
        completion_ids=payload.input_ids,
        completion_mask=token_aligned(payload.completion_mask),
        advantages=token_aligned(payload.advantages),
        ref_per_token_logps=None if payload.ref_logps is None else token_aligned(payload.ref_logps),
        old_per_token_logps=token_aligned(payload.old_logps),
        segment_ids=payload.segment_ids,
        segment_positions=payload.positions,
        num_segments=tokens + 1,  # as Tunix's packer: at most one segment per token, plus padding
    )
    return RoutedExample(example, payload.routed_experts)


def model_input(algo_config: Any) -> Callable[[RoutedExample], dict[str, Any]]:
    """The worker's input hook: Tunix's loss arguments, the routes as one more."""

    def to_loss_kwargs(example: RoutedExample) -> dict[str, Any]:
        return {
            "train_example": example.train_example,
            "algo_config": algo_config,
            "pad_id": PAD_ID,
            "eos_id": EOS_ID,
            "routed_experts": example.routed_experts,
        }

    return to_loss_kwargs


def grpo_loss(api: TunixApi, wrapped: bool, split: str, chunked: ChunkedPass) -> Callable[..., Any]:
    """Tunix's GRPO loss on the engine's model, routes replayed, its log-probs through the pass
    `chunked` says (`split`: the model's head split, `maxtext.head`)."""

    def loss(model, train_example, algo_config, pad_id, eos_id, routed_experts=None):
        return api.grpo_loss_fn(
            api.replaying(model, routed_experts, wrapped, split),
            train_example,
            algo_config,
            pad_id,
            eos_id,
            compute_logps_chunk_size=chunked.chunk_size,
        )

    return loss


class ReplayingCall:
    """Tunix's model call `(tokens, positions, cache, attention_mask, segment_ids, skip_lm_head)`
    over MaxText's model with the rollout's routes forced, and `compute_final_logits`, so that
    Tunix's chunked pass can run on it (`maxtext.head`: the model's own split, or its decoder's).
    """

    def __init__(self, model: Any, routes: Any, wrapped: bool, split: str):
        self.model = model
        self.routes = routes
        self.wrapped = wrapped
        self.split = split

    def forced_routes(self) -> Any:
        return self.routes

    def __call__(
        self, input_tokens, positions, cache, attention_mask, segment_ids=None, skip_lm_head=False
    ):
        routes = self.forced_routes()
        if skip_lm_head and self.split == maxtext_head.DECODER:
            transformer = maxtext_head.transformer_of(self.model, self.wrapped)
            return maxtext_head.hidden_states(
                transformer, input_tokens, positions, segment_ids, routes
            ), None
        native = {"skip_lm_head": True} if skip_lm_head else {}
        if self.wrapped:  # MaxText's TunixMaxTextAdapter: its own Tunix call, routes added
            return self.model(
                input_tokens,
                positions,
                cache,
                attention_mask,
                forced_routed_experts=routes,
                segment_ids=segment_ids,
                **native,
            )
        logits = self.model(
            decoder_input_tokens=input_tokens,
            decoder_positions=positions,
            decoder_segment_ids=segment_ids,
            forced_routed_experts=routes,
            **native,
        )
        return logits, None

    def compute_final_logits(self, hidden: Any) -> Any:
        """The logits of a chunk of hidden states, by the model's own head."""
        if self.split == maxtext_head.NATIVE:
            return self.model.compute_final_logits(hidden)
        return maxtext_head.output_head(
            maxtext_head.transformer_of(self.model, self.wrapped), hidden
        )


def _replaying_call() -> Callable[[Any, Any, bool, str], Any]:
    """`ReplayingCall` as the nnx module Tunix's pass splits and merges, the routes a Variable."""
    from flax import nnx  # Tunix's and MaxText's dependency: absent where they are

    class ReplayingTunixCall(ReplayingCall, nnx.Module):
        def __init__(self, model: Any, routes: Any, wrapped: bool, split: str):
            super().__init__(
                model, None if routes is None else nnx.Variable(routes), wrapped, split
            )

        def forced_routes(self) -> Any:
            return None if self.routes is None else self.routes.value

    return ReplayingTunixCall
