"""`python -m installer.verify`: the NVML child."""

import sys

from installer.verify.child import main

sys.exit(main())
