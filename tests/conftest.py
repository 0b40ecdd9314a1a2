"""Test session set-up: 8 host CPU devices, so mesh and sharding tests run as 2x2x2 on any machine.

XLA reads the device count when JAX first initializes its backend, so it is set here, before any
test module imports JAX.
"""

import os

os.environ["JAX_PLATFORMS"] = "cpu"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()
