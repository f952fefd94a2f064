"""Custom components of the reliability suites (lfx embeds each module's source in the flow,
and the executor's guest compiles it)."""
