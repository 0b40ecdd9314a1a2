"""Which function each op of a compiled module came from, where the op carries no stack of its
own: the loop that runs it, and the stack's innermost frame where no package frame is on it."""

import collections

import jax
import jax.numpy as jnp

from rl_trainer_bench.preflight.hlo.parse import parse_hlo
from rl_trainer_bench.preflight.hlo.sources import op_sources, stack_tables

HERE = "tests/preflight/"  # this file stands for the package: its functions are the sources


def scanned(x):
    def step(carry, row):
        carry = carry * 0.5 + jnp.sin(row)
        return carry, carry.sum()

    return jax.lax.scan(step, x[0], x)


def compiled_text(function, *args):
    return jax.jit(function).lower(*args).compile().as_text()


def test_a_loops_stackless_ops_are_placed_in_the_function_that_loops():
    text = compiled_text(scanned, jnp.ones((16, 8, 8)))
    module = parse_hlo(text)
    sources = op_sources(module, text, package=HERE)
    loop = next(
        i for c in module.computations.values() for i in c.instructions if i.opcode == "while"
    )
    assert sources[loop.name] == "test_hlo_sources.py:scanned"
    body = module.computations[loop.attribute("body").lstrip("%")]
    stackless = [sources[i.name] for i in body.instructions if i.opcode in ("add", "tuple")]
    assert stackless and all(s.startswith("(no stack: ") for s in stackless)
    assert all(s.endswith(", in test_hlo_sources.py:scanned)") for s in stackless)
    # every op has a source; none is the bare '(no stack)' of before
    assert "(no stack)" not in collections.Counter(sources.values())


def test_an_op_whose_stack_never_enters_the_package_names_its_innermost_frame():
    text = compiled_text(lambda x: jnp.sin(x) * 2, jnp.ones(8))
    module = parse_hlo(text)
    sources = op_sources(module, text, package="no/such/package/")
    framed = {s for s in sources.values() if s.startswith("(no package frame")}
    assert framed and all(s.startswith("(no package frame: ") and ".py:" in s for s in framed)
    assert stack_tables(text)["StackFrames"]  # the frames it named are the module's own
