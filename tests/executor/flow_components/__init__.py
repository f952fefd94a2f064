"""Custom components used by the executor tests. Each lives in its own module because lfx
embeds the whole module source in the flow JSON, and the guest compiles that source."""
