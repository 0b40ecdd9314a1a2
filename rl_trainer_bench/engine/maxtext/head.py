"""MaxText's model as hidden states and an output head: what Tunix's chunked log-prob pass needs.

A trainer with `--compute_logps_chunk_size=N` scores tokens with Tunix's chunked pass: the model
is called with `skip_lm_head=True` for its last hidden states [B, T, D], and the pass applies the
model's `compute_final_logits` to N tokens at a time under remat, so the [B, T, V] logits never
exist at once (on the 397B cell's 248,320-token vocabulary the full logits of a micro-batch are
several GiB per device). Tunix takes that path only for a model whose call has `skip_lm_head` and
which has `compute_final_logits`; maxtext 0.2.5's `Transformer` and `TunixMaxTextAdapter` have
neither, so a bench that hands Tunix MaxText's model as it is would compute full logits where the
trainer does not.

This module finds the split in the MaxText in use, in this order (`head_split`):

- **the model's own** (`NATIVE`): its call takes `skip_lm_head` and it has `compute_final_logits`
  (a MaxText that added them): used as it is;
- **around MaxText's decoder** (`DECODER`): `Transformer.decoder(...)` returns the last hidden
  states beside the logits, and `Transformer.logits_from_hidden_states_for_vocab_tiling` applies
  the decoder's `apply_output_head` (final norm, then the tied or untied projection) to any slice
  of them: the hidden states come from the decoder call the model's own call makes, with the same
  arguments, and the logits it computes there are not used, so XLA drops them;
- **none** (`NONE`), with why: the model lacks those parts, or its call does more than the decoder
  (multi-token prediction, a multimodal encoder), which a decoder-only call would leave out.

Everything is duck-typed on maxtext 0.2.5's public names; nothing here imports MaxText or flax.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

NATIVE = "native"
DECODER = "decoder"
NONE = "none"
TRAIN_MODE = "train"  # MaxText's MODEL_MODE_TRAIN
# Dropout as the model's own call runs it: `Transformer.__call__(enable_dropout=True)`, which
# Tunix's call and TunixMaxTextAdapter leave at its default, passes deterministic=False.
DETERMINISTIC = False
_HEAD_METHOD = "logits_from_hidden_states_for_vocab_tiling"
_DECODER_PARTS = ("decoder", "token_embedder", _HEAD_METHOD)
# Config keys whose parts MaxText's model call runs besides its decoder.
_BESIDE_THE_DECODER = (
    ("mtp_num_layers", "multi-token prediction"),
    ("use_multimodal", "an encoder"),
)


@dataclasses.dataclass(frozen=True)
class HeadSplit:
    """How the model gives Tunix hidden states and an output head, or why it cannot."""

    kind: str  # NATIVE, DECODER or NONE
    why: str  # how (NATIVE, DECODER) or why not (NONE)


def transformer_of(model: Any, wrapped: bool) -> Any:
    """MaxText's Transformer: the model itself, or the one TunixMaxTextAdapter wraps (`base`)."""
    return model.base if wrapped else model


def takes_skip_lm_head(model: Any) -> bool:
    """Whether Tunix's chunked pass can use `model` as it is (its own test, `rl/common.py`)."""
    parameters = inspect.signature(type(model).__call__).parameters
    return "skip_lm_head" in parameters and callable(getattr(model, "compute_final_logits", None))


def head_split(model: Any, wrapped: bool) -> HeadSplit:
    """The split the MaxText in use offers (module docstring), checked on the engine's model."""
    if takes_skip_lm_head(model):
        return HeadSplit(NATIVE, "the model's own skip_lm_head and compute_final_logits")
    transformer = transformer_of(model, wrapped)
    missing = [part for part in _DECODER_PARTS if not hasattr(transformer, part)]
    if missing:
        return HeadSplit(
            NONE,
            f"this MaxText's model call takes no skip_lm_head and its Transformer lacks"
            f" {', '.join(missing)}",
        )
    config = transformer.config
    beside = [what for key, what in _BESIDE_THE_DECODER if getattr(config, key, 0)]
    if beside:
        return HeadSplit(
            NONE,
            f"MaxText's model call runs {' and '.join(beside)} besides its decoder, which"
            " hidden states from the decoder alone would leave out",
        )
    return HeadSplit(
        DECODER,
        "MaxText's decoder: its hidden states, then"
        f" Transformer.{_HEAD_METHOD} (the decoder's apply_output_head) on each chunk",
    )


def hidden_states(
    transformer: Any, tokens: Any, positions: Any, segment_ids: Any, routes: Any
) -> Any:
    """The decoder's last hidden states [B, T, D], from the call `Transformer.__call__` makes."""
    outputs = transformer.decoder(
        shared_embedding=transformer.token_embedder,
        decoder_input_tokens=tokens,
        decoder_positions=positions,
        decoder_segment_ids=segment_ids,
        deterministic=DETERMINISTIC,
        model_mode=TRAIN_MODE,
        forced_routed_experts=routes,
    )
    return outputs[1]  # (logits, hidden_state, kv_caches[, expert_indices])


def output_head(transformer: Any, hidden: Any) -> Any:
    """The logits of `hidden` (any slice of the hidden states): MaxText's own output head."""
    head = getattr(transformer, _HEAD_METHOD)
    return head(hidden, DETERMINISTIC, TRAIN_MODE)
