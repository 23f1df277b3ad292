import sys

from cstorch.parity.runner import main

sys.exit(main())
