"""A micro-batch shaped for an engine config, for the engine tests that build one from a preset's
config rather than from the pool."""

from rl_trainer_bench.engine.config import EngineConfig
from rl_trainer_bench.engine.contract import Payload, example_payload


def config_payload(config: EngineConfig, seed: int = 0, segment_len: int = 24) -> Payload:
    """The example micro-batch of `config`'s rows, sequence and model, named after its seed."""
    model = config.model
    return example_payload(
        config.micro_batch_rows,
        config.seq_len,
        model.vocab_size,
        num_layers=model.num_layers,
        top_k=model.top_k,
        num_experts=model.num_experts,
        segment_len=segment_len,
        seed=seed,
        name=f"mb{seed}",
    )
