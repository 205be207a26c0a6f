"""python -m specdec_fast generate|demo ... (see specdec_fast/cli.py)."""
import sys

from .cli import main

sys.exit(main())
