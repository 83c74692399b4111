import sys

from jaxmem.cli import main

sys.exit(main())
