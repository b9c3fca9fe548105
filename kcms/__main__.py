import sys

from kcms.cli import main

sys.exit(main())
