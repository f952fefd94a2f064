"""The CreateOS Sandbox component package."""
