"""The file a bench pod runs: the driver, with knobs from the environment (DRIVER_ENV) and flags.

Kept thin so the code a pod runs is the package's, digested and logged by the driver at start.
"""

import sys

from rl_trainer_bench.bench.entry import main

if __name__ == "__main__":
    sys.exit(main())
