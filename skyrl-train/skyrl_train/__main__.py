import sys

from skyrl_train.cli import main

sys.exit(main())
