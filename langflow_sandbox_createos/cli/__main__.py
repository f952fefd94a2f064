import sys

from langflow_sandbox_createos.cli import main

sys.exit(main())
