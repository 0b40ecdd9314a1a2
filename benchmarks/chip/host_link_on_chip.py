"""The host-to-device link a micro-batch crosses on one chip: one array against pieces, alone and
beside a running program, and through pinned host memory.

The step boundary's copy is the micro-batch's arrays in their own shapes (`payload_shapes`: the
preset's rows and tokens, with `extra_host_bytes`' filler at each size asked for). For each size
this times, after a first copy of the same arrays (medians of REPEATS):
- `whole`: each array in one `device_put` to its input sharding (the copy a plain engine makes);
- `pieces-N`: each array over PIECE_MIN bytes split into N contiguous pieces of its rows-by-tokens
  view, put together in one `device_put`, then joined on the device into the array (the join's
  own device time is timed apart: `join`);
- `pinned`: through a `pinned_host` copy first, then to the device;
- `issue`: how long each `device_put` call takes to return (the copy may still run);
- `beside`: a ~0.4 s program of matmuls dispatched first, then the copy issued: the program's time
  against its time alone, and when the copy was ready (a watcher thread's stamp);
- `engine_same` / `engine_rotating`: the built-in engine's own unstaged copy (`InputCopy.copy`),
  of the same micro-batch each time or of `--rotate` distinct ones in turn, as a run's pool
  rotates them (`--engine-only` times these alone);
- `engine_first_of_two`: the engine's copy of one micro-batch until it is on the device, the next
  one's copy issued right after it, as an unstaged step's first two `fwd_bwd` calls issue them.
Every figure is the chip's own; the bench's engine picks its path from what this prints
(BENCHMARKS.md, "What STAGE_BEFORE_UPDATE saves on one v5e chip").

    python benchmarks/chip/host_link_on_chip.py --output link.json --sizes 0,64,128,256,512
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rl_trainer_bench.config.presets import preset
from rl_trainer_bench.engine.builtin import input_copy, sharding
from rl_trainer_bench.engine.payload_shapes import payload_shapes
from rl_trainer_bench.io import check_output_file, write_text_atomically

REPEATS = 5
PIECE_MIN = 4 << 20
MIB = 1 << 20


def arrays_at(name: str, extra_mib: int) -> dict[str, np.ndarray]:
    config = dataclasses.replace(preset(name).engine, extra_host_bytes=extra_mib * MIB)
    rng = np.random.default_rng(0)
    out = {}
    for key, (shape, dtype) in payload_shapes(config).items():
        out[key] = rng.integers(0, 100, size=shape).astype(dtype)
    return out


def median_s(fn, repeats=REPEATS) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def split(array: np.ndarray, n: int) -> list[np.ndarray]:
    flat = array.reshape(array.shape[0] * array.shape[1], -1)
    return np.array_split(flat, n, axis=0)


def counts(text: str) -> list[int]:
    """A comma-separated list of whole numbers of at least 0 (argparse names the flag)."""
    try:
        values = [int(word) for word in text.split(",")]
    except ValueError:
        values = [-1]
    if any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas")
    return values


def engine_copies(mesh, arrays: dict[str, np.ndarray], rotate: int) -> dict[str, float]:
    """The engine's unstaged copy of the same micro-batch each time, and of `rotate` distinct
    ones (fresh host buffers of the same shapes) in turn."""
    spec = {k: jax.ShapeDtypeStruct(a.shape, a.dtype) for k, a in arrays.items()}
    copier = input_copy.InputCopy(mesh, spec, input_copy.piece_bytes_for("tpu"))
    distinct = [arrays] + [{k: a.copy() for k, a in arrays.items()} for _ in range(rotate - 1)]
    turn = iter(range(10**9))
    try:
        return {
            "engine_same_s": median_s(lambda: copier.copy(arrays)),
            "engine_rotating_s": median_s(
                lambda: copier.copy(distinct[next(turn) % rotate]), 2 * rotate
            ),
            "engine_first_of_two_s": first_of_two_s(copier, distinct[0], distinct[-1]),
        }
    finally:
        copier.close()


def first_of_two_s(copier, first: dict, second: dict) -> float:
    """When the first of two micro-batches is on the device, the second's copy issued right
    after it: as an unstaged step's first `fwd_bwd` and its second issue them (median of
    REPEATS after a first)."""
    times = []
    for _ in range(REPEATS + 1):
        start = time.perf_counter()
        copied, following = copier.copy(first), copier.copy(second)
        jax.block_until_ready(copied)
        times.append(time.perf_counter() - start)
        jax.block_until_ready(following)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tpu-v5e-1")
    parser.add_argument(
        "--sizes", type=counts, default="0,64,128,256,512", help="extra MiB a micro-batch"
    )
    parser.add_argument("--pieces", type=counts, default="4,8,16,32", help="pieces an array")
    parser.add_argument("--pinned-up-to", type=int, default=128, help="MiB; slower past it")
    parser.add_argument("--busy-size", type=int, default=8192, help="the program's matmul width")
    parser.add_argument("--rotate", type=int, default=5, help="distinct micro-batches in turn")
    parser.add_argument("--engine-only", action="store_true", help="only the engine's copies")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    check_output_file(args.output, "--output")
    device = jax.devices()[0]
    mesh = sharding.make_mesh(preset(args.preset).engine.mesh, [device])
    big = jnp.ones((args.busy_size, args.busy_size), jnp.bfloat16)

    @jax.jit
    def busy(x):
        def body(_, y):
            return (y @ x) * 0.5

        return jax.lax.fori_loop(0, 60, body, x)

    program_alone = median_s(lambda: busy(big), 3)
    results = {"device": str(device), "program_alone_s": program_alone, "sizes": []}
    print(f"program alone {program_alone * 1e3:.1f} ms", flush=True)
    for mib in args.sizes:
        arrays = arrays_at(args.preset, mib)
        total = sum(a.nbytes for a in arrays.values())
        to = {k: sharding.payload_sharding(mesh, a.ndim) for k, a in arrays.items()}
        row = {"extra_mib": mib, "bytes": total, "shapes": {k: a.shape for k, a in arrays.items()}}
        row.update(engine_copies(mesh, arrays, args.rotate))
        if args.engine_only:
            results["sizes"].append(row)
            print(json.dumps(row), flush=True)
            continue
        copies = {"whole": lambda a=arrays, t=to: jax.device_put(a, t)}
        row["whole_s"] = median_s(copies["whole"])
        start = time.perf_counter()
        issued = jax.device_put(arrays, to)
        row["issue_whole_s"] = time.perf_counter() - start
        jax.block_until_ready(issued)
        del issued
        for n in args.pieces:
            if not any(a.nbytes >= PIECE_MIN for a in arrays.values()):
                break
            pieces = {k: split(a, n) if a.nbytes >= PIECE_MIN else [a] for k, a in arrays.items()}
            shapes = {k: a.shape for k, a in arrays.items()}

            @jax.jit
            def join(parts, shapes=shapes):
                return {
                    k: jnp.concatenate(p, axis=0).reshape(shapes[k]) if len(p) > 1 else p[0]
                    for k, p in parts.items()
                }

            def put(pieces=pieces):
                return jax.device_put(pieces, device)

            on_device = jax.block_until_ready(put())
            row[f"join_{n}_s"] = median_s(lambda d=on_device, j=join: j(d))
            copies[f"pieces_{n}"] = lambda p=put, j=join: j(p())
            row[f"pieces_{n}_s"] = median_s(copies[f"pieces_{n}"])
            row[f"pieces_{n}_put_only_s"] = median_s(put)
            start = time.perf_counter()
            issued = put()
            row[f"issue_pieces_{n}_s"] = time.perf_counter() - start
            jax.block_until_ready(issued)
            del issued, on_device
        if mib <= args.pinned_up_to:
            pinned = {
                k: sharding.payload_sharding(mesh, a.ndim, "pinned_host") for k, a in arrays.items()
            }
            row["pinned_s"] = median_s(
                lambda a=arrays, p=pinned, t=to: jax.device_put(jax.device_put(a, p), t), 3
            )
        for label, copy in copies.items():
            runs = []
            for _ in range(3):
                start = time.perf_counter()
                out = busy(big)
                issued_at = time.perf_counter()
                copied = copy()
                issue_s = time.perf_counter() - issued_at
                ready = {}
                watcher = threading.Thread(
                    target=lambda c=copied, r=ready: (
                        jax.block_until_ready(c),
                        r.setdefault("t", time.perf_counter()),
                    )
                )
                watcher.start()
                jax.block_until_ready(out)
                program_s = time.perf_counter() - start
                watcher.join()
                runs.append(
                    {
                        "program_s": program_s,
                        "copy_ready_after_issue_s": ready["t"] - issued_at,
                        "issue_s": issue_s,
                    }
                )
                del copied
            row[f"beside_{label}"] = runs
        results["sizes"].append(row)
        print(json.dumps(row), flush=True)
    write_text_atomically(args.output, json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
