"""The file a bench pod runs: the driver, with knobs from the environment (DRIVER_ENV) and flags.

Kept thin so the code a pod runs is the package's, digested and logged by the driver at start.
"""

from rl_trainer_bench.bench.entry import main
from rl_trainer_bench.errors import exit_process

if __name__ == "__main__":
    exit_process(main())
