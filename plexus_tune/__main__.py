import sys

from plexus_tune.cli import main

sys.exit(main())
