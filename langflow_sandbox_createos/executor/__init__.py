"""The ``createos`` whole-flow executor: the entire graph runs in a throwaway CreateOS guest.

Selected with ``LANGFLOW_EXECUTOR_KIND=createos``; lfx instantiates :class:`CreateOSExecutor`
from the ``lfx.executors`` entry point. It covers everything that goes through lfx's
execution coordinator (``/api/v1/run`` via ``Graph.arun``, the ``lfx run`` command, Loop
subgraphs), not the vertices of a canvas build, whose endpoint walks them itself.

One run: create a guest (``lf-x-...``) → one streaming exec of ``python3 -c <bootstrap>``
whose stdin carries the guest runner (one text, ``guest.runner_source``), the run spec
(``spec.run_spec``) and a per-run frame secret → delete the guest, always. Each vertex's
event is yielded as soon as the guest writes it; the run ends with
``RunComplete(outputs=list[RunOutputs])`` harvested in the guest the way ``Graph._run`` does
it. A failure in the guest raises from the stream.

Runtime options understood (others are ignored): ``initial_inputs``, ``max_iterations``,
``config``, ``reset_output_values``, ``fallback_to_env_vars``, ``outputs``,
``inputs_components``, ``types``, ``session_id`` and ``event_manager`` (its callbacks are
relayed from the guest, see ``replay.py``). ``open_flow_span`` and ``_``-prefixed keys stay
on the host (debug log). ``stream`` is accepted, but generator results are always drained in
the guest: a live generator cannot cross to the host. The graph's runtime state crosses too
(see ``spec.vertex_state`` and docs/executor.md, "Parity").

With ``CREATEOS_EXECUTOR_WARM_POOL=N`` the create, the runner's start and lfx's import happen
ahead of need on a pooled guest (``lf-xw-...``, see ``pool.py``); the run uploads its spec
to the waiting runner and reads the stream that guest has held open since warm-up.

The modules: ``engine`` (the class: one run in named steps), ``spec`` (what the guest is
sent), ``run`` (one guest and its exec), ``pool`` (warm guests), ``framing`` (the frame format, shared with the guest), ``reader`` (frames out
of the exec's output), ``results`` (frames as lfx results), ``replay``, ``bridge`` and
``tracing`` (what the host does for the guest: messages, events and history reads, sandboxed
nodes, the run's trace), ``flows`` (the flows a run may load), ``variables`` (the run user's
global variables, resolved on the host), ``timeline`` (where a run's time goes, at DEBUG),
``guest/`` (the runner).

The class is in ``engine.py``; this package re-exports it (the entry point names
``langflow_sandbox_createos.executor:CreateOSExecutor``). Importing it is cheap and reads no
settings.
"""

from langflow_sandbox_createos.executor.engine import CreateOSExecutor

__all__ = ["CreateOSExecutor"]
