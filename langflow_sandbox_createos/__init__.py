"""Run the Python code of Langflow flows on disposable CreateOS microVMs.

Three surfaces, each switched on by itself:
  - sandbox backend  (entry point group lfx.sandbox_backends, name createos)
  - CreateOS Sandbox component (langflow.extensions: extension.json in this package)
  - whole-flow executor (lfx.executors, kind createos)

Importing this package is cheap and reads no settings: lfx imports it while it
is still building its own settings.
"""

__version__ = "0.3.0"

# Where this project's documentation lives (docs/ of its repository). The component's
# "Documentation" link and pyproject's [project.urls] both point here (a test keeps them equal).
DOCS_URL = "https://github.com/NodeOps-app/langflow-sandbox-createos/tree/main/docs"
