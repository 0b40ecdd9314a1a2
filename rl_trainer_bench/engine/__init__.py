"""The built-in JAX MoE engine and the contract any engine implements."""
