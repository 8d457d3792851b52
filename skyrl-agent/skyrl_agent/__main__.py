import sys

from skyrl_agent.cli import main

sys.exit(main())
