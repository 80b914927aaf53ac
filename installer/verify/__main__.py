"""`python -m installer.verify`: the NVML child; `python -m installer.verify cuda`: the CUDA one."""

import sys

if sys.argv[1:] == ["cuda"]:
    from installer.verify.cuda_child import main
else:
    from installer.verify.child import main

sys.exit(main())
