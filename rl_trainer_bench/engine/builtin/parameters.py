"""Every parameter of the decoder in one table: its shape, how it starts and how it is sharded.

Initialisation (`model.init_params`), the layer weights the decoder scans over (`LAYER_WEIGHTS`)
and the sharding rules (`sharding.parameter_shardings`) all read this table, so a new weight is one
row. Shapes are written in the legend's letters (docs/engine.md): V vocabulary, D model width,
L layers, H query heads, KV key/value heads, hd head width, E experts, F an expert's hidden width,
Fs the shared expert's hidden width; Lf, Ll the full- and linear-attention layers, Hg the query
heads of the attention output gate (0 without one), Hk, Dk, Hv, Dv Gated DeltaNet's key and value
heads and widths, taps its convolutions' length. A leading L, Lf or Ll marks a layer weight
(stacked on every layer, or on the layers of that mixer).
"""

from __future__ import annotations

import dataclasses
import math

from rl_trainer_bench.engine.config import ModelConfig

ONES = None  # `fan_in` of a norm scale: initialised to one
# Leading dims of stacked layer weights, and the mixer whose layers each stacks (None: every layer).
LAYER_LETTERS = {"L": None, "Lf": "full_attention", "Ll": "linear_attention"}


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One weight: dims in legend letters, the dims whose product is its fan-in, its mesh axes.

    `fan_in=()` is a fan-in of 1 (the embedding); `ONES` starts the weight at one. `sharded` names
    the dim split over the mesh's parameter axes (`sharding.PARAMETER_AXES`); `expert_dim` names the
    dim split over the expert axis instead, for expert weights. `float32` weights (norm scales,
    the router) stay in float32 where they are used; the others are cast to the compute dtype.
    """

    dims: tuple[str, ...]
    fan_in: tuple[str, ...] | None
    sharded: str | None = None
    expert_dim: str | None = None
    float32: bool = False

    @property
    def layered(self) -> bool:
        return self.dims[0] in LAYER_LETTERS


# The order of the randomly initialised rows fixes which key each draws.
PARAMETERS: dict[str, Parameter] = {
    "embed": Parameter(("V", "D"), fan_in=(), sharded="V"),
    "head": Parameter(("D", "V"), fan_in=("D",), sharded="V"),
    "wq": Parameter(("Lf", "D", "H", "hd"), fan_in=("D",), sharded="D"),
    "wk": Parameter(("Lf", "D", "KV", "hd"), fan_in=("D",), sharded="D"),
    "wv": Parameter(("Lf", "D", "KV", "hd"), fan_in=("D",), sharded="D"),
    "wo": Parameter(("Lf", "H", "hd", "D"), fan_in=("H", "hd"), sharded="D"),
    "router": Parameter(("L", "D", "E"), fan_in=("D",), sharded="D", float32=True),
    "expert_gate": Parameter(("L", "E", "D", "F"), fan_in=("D",), sharded="D", expert_dim="E"),
    "expert_up": Parameter(("L", "E", "D", "F"), fan_in=("D",), sharded="D", expert_dim="E"),
    "expert_down": Parameter(("L", "E", "F", "D"), fan_in=("F",), sharded="D", expert_dim="E"),
    "shared_gate": Parameter(("L", "D", "Fs"), fan_in=("D",), sharded="D"),
    "shared_up": Parameter(("L", "D", "Fs"), fan_in=("D",), sharded="D"),
    "shared_down": Parameter(("L", "Fs", "D"), fan_in=("Fs",), sharded="D"),
    "attn_norm": Parameter(("L", "D"), fan_in=ONES, sharded="D", float32=True),
    "mlp_norm": Parameter(("L", "D"), fan_in=ONES, sharded="D", float32=True),
    "final_norm": Parameter(("D",), fan_in=ONES, sharded="D", float32=True),
    "wq_gate": Parameter(("Lf", "D", "Hg", "hd"), fan_in=("D",), sharded="D"),
    # Gated DeltaNet (`gated_deltanet.py`); A_log and dt_bias start as normal(0, 1).
    "gdn_wq": Parameter(("Ll", "D", "Hk", "Dk"), fan_in=("D",), sharded="D"),
    "gdn_wk": Parameter(("Ll", "D", "Hk", "Dk"), fan_in=("D",), sharded="D"),
    "gdn_wv": Parameter(("Ll", "D", "Hv", "Dv"), fan_in=("D",), sharded="D"),
    "gdn_wz": Parameter(("Ll", "D", "Hv", "Dv"), fan_in=("D",), sharded="D"),
    "gdn_wb": Parameter(("Ll", "D", "Hv"), fan_in=("D",), sharded="D"),
    "gdn_wa": Parameter(("Ll", "D", "Hv"), fan_in=("D",), sharded="D"),
    "gdn_conv_q": Parameter(("Ll", "taps", "Hk", "Dk"), fan_in=("taps",), sharded="Dk"),
    "gdn_conv_k": Parameter(("Ll", "taps", "Hk", "Dk"), fan_in=("taps",), sharded="Dk"),
    "gdn_conv_v": Parameter(("Ll", "taps", "Hv", "Dv"), fan_in=("taps",), sharded="Dv"),
    "gdn_a_log": Parameter(("Ll", "Hv"), fan_in=(), sharded="Hv", float32=True),
    "gdn_dt_bias": Parameter(("Ll", "Hv"), fan_in=(), sharded="Hv", float32=True),
    "gdn_norm": Parameter(("Ll", "Dv"), fan_in=ONES, sharded="Dv", float32=True),
    "gdn_wo": Parameter(("Ll", "Hv", "Dv", "D"), fan_in=("Hv", "Dv"), sharded="D"),
}

LAYER_WEIGHTS = tuple(name for name, p in PARAMETERS.items() if p.dims[0] == "L")
# The weights of each mixer, stacked on that mixer's layers.
MIXER_WEIGHTS = {
    mixer: tuple(name for name, p in PARAMETERS.items() if p.dims[0] == letter)
    for letter, mixer in LAYER_LETTERS.items()
    if mixer
}


def dim_sizes(config: ModelConfig) -> dict[str, int]:
    """The size of every legend letter a parameter uses."""
    return {
        "V": config.vocab_size,
        "D": config.d_model,
        "L": config.num_layers,
        "H": config.num_heads,
        "KV": config.num_kv_heads,
        "hd": config.head_dim,
        "E": config.num_experts,
        "F": config.expert_ffn_dim,
        "Fs": config.shared_expert_ffn_dim,
        "Lf": config.layers_of("full_attention"),
        "Ll": config.layers_of("linear_attention"),
        "Hg": config.num_heads if config.attention_output_gate else 0,
        "Hk": config.linear_num_key_heads,
        "Dk": config.linear_key_head_dim,
        "Hv": config.linear_num_value_heads,
        "Dv": config.linear_value_head_dim,
        "taps": config.linear_conv_kernel_dim,
    }


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every parameter the model has (a weight with a zero-sized dim does not exist)."""
    sizes = dim_sizes(config)
    shapes = {name: tuple(sizes[d] for d in p.dims) for name, p in PARAMETERS.items()}
    return {name: shape for name, shape in shapes.items() if all(shape)}


def fan_in(config: ModelConfig, name: str) -> int:
    """The product of a randomly initialised parameter's fan-in dims."""
    sizes = dim_sizes(config)
    return math.prod(sizes[d] for d in PARAMETERS[name].fan_in)
