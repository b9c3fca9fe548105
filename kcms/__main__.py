import sys

from kcms.cmd.main import main

sys.exit(main())
