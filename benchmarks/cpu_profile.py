"""Run ``sqs-worker`` under cProfile counting CPU time (not wall time: on a loaded machine wall time mostly
measures waiting for a core), and write the stats at exit.

    python benchmarks/cpu_profile.py OUT.prof run      # what compare_celery.py --profile-dir runs
"""

from __future__ import annotations

import cProfile
import sys
import time


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    from worker.commands.__main__ import main as worker_main

    sys.argv = ["sqs-worker", *args]
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        return worker_main()
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    sys.exit(main())
