"""The CreateOS Sandbox canvas component: Python or a shell command on a CreateOS microVM,
with optional guest reuse and the files the program wrote returned as a table.

lfx loads this file by itself (spec_from_file_location), so every import is absolute and
the work lives in `langflow_sandbox_createos.component.engine`.
"""

import threading

from lfx.custom.custom_component.component import Component
from lfx.io import BoolInput, DropdownInput, IntInput, MultilineInput, Output, StrInput
from lfx.schema.data import Data
from lfx.schema.dataframe import DataFrame

from langflow_sandbox_createos import DOCS_URL
from langflow_sandbox_createos.component import artifacts, engine, policy
from langflow_sandbox_createos.core.settings import DEFAULT_COMPONENT_SHAPE, MAX_TIMEOUT_SECONDS

# Loaded by Langflow when it discovers the extension, before any run applies tweaks.
policy.register_protected_tweak_fields()


class CreateOSSandboxComponent(Component):
    display_name = "CreateOS Sandbox"
    description = (
        "Run code or a shell command in an isolated CreateOS microVM, and collect the files it writes."
    )
    documentation = f"{DOCS_URL}/component.md"
    icon = "container"  # its own, not the Python Interpreter's square-terminal
    name = "CreateOSSandbox"

    inputs = [
        MultilineInput(
            name="python_code",
            display_name="Python Code",
            info="Python to run in the guest with python3. Ignored when Command is set.",
            value="print('hello from a microVM')",
            input_types=["Message"],
        ),
        StrInput(
            name="command",
            display_name="Command",
            info="A shell command to run with /bin/sh -c instead of the Python code.",
            value="",
        ),
        DropdownInput(
            name="session_mode",
            display_name="Guest Reuse",
            info=(
                "off: a fresh guest per run, deleted afterwards. flow: one guest per flow, component, "
                "Langflow user and network setting, kept (paused when idle) so packages and files carry "
                "over. session: the same, per chat session too. A reused guest idle longer than "
                "CREATEOS_SANDBOX_REUSE_IDLE_SECONDS (default 1 h) is deleted. A run with no Langflow user "
                "gets a fresh guest."
            ),
            options=list(engine.REUSE_MODES),
            value="off",
        ),
        BoolInput(
            name="collect_artifacts",
            display_name="Return Files",
            info=(
                "Return what the program wrote under /workspace/artifacts (emptied before the run). The files "
                "arrive on the second output, Files (a table: path, size, text or base64), not in Results: "
                "at most 256 files and 5 MiB."
            ),
            value=False,
        ),
        BoolInput(
            name="allow_network",
            display_name="Allow Network",
            info="Off blocks egress (deny-all rule). On is completely unrestricted.",
            value=False,
        ),
        IntInput(
            name="timeout_seconds",
            display_name="Timeout (seconds)",
            info=f"Wall clock for the program, enforced inside the VM. 1 to {MAX_TIMEOUT_SECONDS}.",
            value=60,
            advanced=True,
        ),
        StrInput(
            name="shape",
            display_name="Shape",
            info=(
                f"VM size from the CreateOS shape catalog. Empty: CREATEOS_SANDBOX_SHAPE, else "
                f"{DEFAULT_COMPONENT_SHAPE}."
            ),
            value="",
            placeholder=DEFAULT_COMPONENT_SHAPE,
            advanced=True,
        ),
    ]

    outputs = [
        Output(display_name="Results", name="results", method="run_sandbox"),
        Output(display_name="Files", name="files", method="collected_files"),
    ]

    # --- one run per build, shared by both outputs -------------------------------------------

    def _pre_run_setup(self) -> None:
        super()._pre_run_setup()
        self._createos_lock = threading.Lock()
        self._createos_result: engine.RunOutcome | BaseException | None = None

    def _outcome(self) -> engine.RunOutcome:
        """The run of this build, executed at most once whichever output asks first; a failure
        is remembered too, so resolving the other output never starts a second guest."""
        if not hasattr(self, "_createos_lock"):
            self._pre_run_setup()
        with self._createos_lock:
            if self._createos_result is None:
                try:
                    self._createos_result = self._execute()
                except BaseException as exc:
                    self._createos_result = exc
            result = self._createos_result
        if isinstance(result, BaseException):
            raise result
        return result

    def _request(self) -> engine.RunRequest:
        code = self.python_code
        fields = {
            "python_code": self._verbatim("python_code", str(getattr(code, "text", code) or "")),
            "command": self._verbatim("command", self.command or ""),
            "session_mode": self.session_mode,
            "collect_artifacts": self.collect_artifacts,
            "allow_network": self.allow_network,
            "timeout_seconds": self.timeout_seconds,
            "shape": self.shape,
        }
        flow_id = session_id = None
        user_id = getattr(self, "_user_id", None)  # set by Langflow, or by a caller without a graph
        if getattr(self, "_vertex", None) is not None:
            flow_id = self.graph.flow_id
            user_id = engine.run_owner(self.graph, self.user_id)  # the end user, where served to one
            session_id = self.graph.session_id
        return engine.build_request(
            fields, component_id=str(self._id), flow_id=flow_id, user_id=user_id, session_id=session_id
        )

    def _verbatim(self, name: str, value: str) -> str:
        """The field as typed on the canvas. lfx turns every backslash-n of a text field into a
        newline before the component sees it, which breaks `print("a\\nb")`; when the value is
        exactly that conversion of the flow's stored value, the stored value is the program."""
        vertex = getattr(self, "_vertex", None)
        if vertex is None or self.get_incoming_edge_by_target_param(name):
            return value
        field = ((vertex.data or {}).get("node") or {}).get("template", {}).get(name)
        if not isinstance(field, dict) or field.get("load_from_db"):
            return value
        raw = field.get("value")
        if isinstance(raw, str) and raw != value and raw.replace("\\n", "\n") == value:
            return raw
        return value

    def _execute(self) -> engine.RunOutcome:
        self._check_policy()
        request = self._request()
        progress = engine.Progress(self)
        outcome = engine.run(request, on_output=progress.on_output, note=progress.note)
        self.status = Data(data=outcome.results(), text_key="result")
        return outcome

    def _check_policy(self) -> None:
        """Langflow's code-execution policy, before anything else: lfx's own gate (the one the
        Python Interpreter calls), the public-flow rule lfx applies to its code-execution
        components, and the tweak protection this module registered at load."""
        policy.ensure_code_execution_enabled()
        vertex = getattr(self, "_vertex", None)
        principal = getattr(vertex.graph, "execution_principal", None) if vertex is not None else None
        if getattr(principal, "kind", None) == "anonymous_public":
            raise policy.public_flow_error(f"{self.display_name} ({self._id})")
        policy.require_protected_tweak_fields()

    # --- outputs ------------------------------------------------------------------------------

    def run_sandbox(self) -> Data:
        return Data(data=self._outcome().results(), text_key="result")

    def collected_files(self) -> DataFrame:
        rows = self._outcome().rows()
        if not rows:
            return DataFrame(columns=list(artifacts.ROW_COLUMNS))
        return DataFrame(rows)
