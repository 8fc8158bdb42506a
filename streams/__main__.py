import sys

from streams.cli import main

sys.exit(main())
