"""The CreateOS Sandbox component's host side: the run engine (``engine.py``), the files a run
returns (``artifacts.py``) and Langflow's code-execution policy (``policy.py``). The canvas
node itself is ``components/createos/createos_sandbox.py``, where Langflow loads it."""
