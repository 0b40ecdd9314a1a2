"""rl_trainer_bench: time a GRPO MoE trainer program alone, on one slice, and say what moved."""

__version__ = "0.1.0"
