"""``python -m cstorch.storage info CKPT`` / ``convert CKPT OUT`` (see :mod:`cstorch.storage.cli`)."""

import sys

from cstorch.storage.cli import main

sys.exit(main())
