import sys

from trainperf.cli import main

sys.exit(main())
