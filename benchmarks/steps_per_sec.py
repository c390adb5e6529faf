"""The steps/sec benchmark (the README's main job); same as ``python -m shapebucket bench``.

python benchmarks/steps_per_sec.py [--quick] [--workload mixture|text] [--strategies a,b] ...
"""

import sys

from shapebucket.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
