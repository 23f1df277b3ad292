"""``python -m cerebras.modelzoo.trainer fit params.yaml``."""

import sys

from cerebras.modelzoo.trainer.cli import main

sys.exit(main())
