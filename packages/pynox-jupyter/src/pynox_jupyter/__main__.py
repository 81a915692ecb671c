import sys

from ._cli import kernel_main

sys.exit(kernel_main())
