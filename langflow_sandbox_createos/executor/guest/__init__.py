"""Programs that run inside CreateOS guests; shipped as source, never imported on the host."""
