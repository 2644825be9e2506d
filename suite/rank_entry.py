"""``python -m suite.rank_entry CONFIG_JSON_FILE RUN_DIR``: one rank of a run whose ranks were
started by torchrun agents (the emulated-network launcher runs one agent per namespace)."""

import sys
from pathlib import Path

from suite.runner import rank_main

if __name__ == "__main__":
    rank_main(Path(sys.argv[1]).read_text(), sys.argv[2])
