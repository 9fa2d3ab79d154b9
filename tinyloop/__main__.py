import sys

from tinyloop.cli import main

sys.exit(main())
