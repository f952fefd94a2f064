#!/usr/bin/env bash
# `make run`: Langflow with the CreateOS plugin, one command, on a fresh machine.
#
#  1. installs what is needed: Debian packages (scripts/install-system-deps.sh), the dev venv
#     and .venv-langflow (langflow from PyPI + this package, editable) through make;
#  2. starts createos-local, the offline control plane, on 127.0.0.1 in the background
#     (unless CREATEOS_SANDBOX_API_KEY and CREATEOS_SANDBOX_BASE_URL are both set: then the
#     real control plane they name is used);
#  3. starts `langflow run` with the sandbox backend switched on, waits for it, imports the
#     starter flow (Python Interpreter + CreateOS Sandbox) through Langflow's REST API and
#     prints the URL to open. With LANGFLOW_AUTO_LOGIN=false the import logs in with
#     LANGFLOW_API_KEY, or LANGFLOW_SUPERUSER and LANGFLOW_SUPERUSER_PASSWORD.
# Ctrl-C (or SIGTERM) stops Langflow, deletes the guests the plugin left on the local control
# plane (`createos-langflow reap --yes --include-active --prefix lf-`, which then says what is
# left), stops createos-local, and exits 0 when all of that went cleanly (1 otherwise).
# The environment Langflow got is written to $RUN_DIR/createos.env (mode 0600: it holds the
# key), for `createos-langflow doctor --env-file` and `reap --env-file`.
#
# Knobs (environment): LANGFLOW_HOST (127.0.0.1), LANGFLOW_PORT (7860), CREATEOS_LOCAL_PORT
# (8787; a free port is used if it is taken), LANGFLOW_START_TIMEOUT (300 s), RUN_DIR (.run),
# VENV (.venv), VENV_LANGFLOW (.venv-langflow), SKIP_INSTALL=1 (do not run make),
# EXECUTOR=createos (whole flows run in CreateOS guests: LANGFLOW_EXECUTOR_KIND=createos, with
# CREATEOS_EXECUTOR_WARM_POOL=2 unless set, so the first runs start at the pool's speed).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-.venv}
VENV_LANGFLOW=${VENV_LANGFLOW:-.venv-langflow}
LANGFLOW_HOST=${LANGFLOW_HOST:-127.0.0.1}
LANGFLOW_PORT=${LANGFLOW_PORT:-7860}
CREATEOS_LOCAL_PORT=${CREATEOS_LOCAL_PORT:-8787}
LANGFLOW_START_TIMEOUT=${LANGFLOW_START_TIMEOUT:-300}
RUN_DIR=${RUN_DIR:-$ROOT/.run}
# createos-local's key: $CREATEOS_LOCAL_API_KEY, else a random one for this run. It reaches
# createos-local and Langflow through their environments, never a file or an argv (a guest
# sees the host's files; a guest with network on can reach createos-local's port).
LOCAL_API_KEY=${CREATEOS_LOCAL_API_KEY:-}

say() { printf '\033[1m[make run]\033[0m %s\n' "$*"; }

# --- 1. install ---------------------------------------------------------------------------------
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  scripts/install-system-deps.sh
  make --no-print-directory langflow VENV="$VENV" VENV_LANGFLOW="$VENV_LANGFLOW"
fi
PY="$ROOT/$VENV_LANGFLOW/bin/python"
[ -x "$PY" ] || { echo "missing $VENV_LANGFLOW: run 'make langflow'" >&2; exit 1; }
[ -n "$LOCAL_API_KEY" ] || LOCAL_API_KEY=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(24))')
mkdir -p "$RUN_DIR"
RUN_DIR=$(cd "$RUN_DIR" && pwd)

port_free() { "$PY" -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null; }
if ! port_free "$LANGFLOW_PORT"; then
  echo "port $LANGFLOW_PORT is taken (another Langflow?). Stop it or set LANGFLOW_PORT=..." >&2
  exit 1
fi

CP_PID= LF_PID= LOCAL_PLANE=0 REAL_PLANE=0 STOPPED=
cleanup() {
  local rc=$? unclean=0
  trap - EXIT INT TERM HUP
  trap '' PIPE  # the terminal (or the pipe we print to) may be gone: keep cleaning up
  set +e
  if [ -n "$LF_PID" ] && kill -0 "$LF_PID" 2>/dev/null; then
    say "stopping Langflow (pid $LF_PID)"
    kill -INT -- "-$LF_PID" 2>/dev/null  # gunicorn: INT is the quick shutdown, TERM the graceful one
    # 40 s: past gunicorn's own 30 s graceful timeout, after which its master kills a worker
    # that has not stopped (a loaded 2-core machine once took over 20 s)
    for _ in $(seq 1 80); do kill -0 "$LF_PID" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$LF_PID" 2>/dev/null; then
      # faulthandler (PYTHONFAULTHANDLER below) writes every thread's stack to langflow.log on
      # SIGABRT: what held the stop up is there to read, then the rest is killed
      say "Langflow did not stop within 40 s: its threads' stacks go to $RUN_DIR/langflow.log, then it is killed"
      kill -ABRT -- "-$LF_PID" 2>/dev/null
      sleep 2
      kill -KILL -- "-$LF_PID" 2>/dev/null
      unclean=1
    fi
  fi
  if [ "$LOCAL_PLANE" = 1 ]; then
    if [ -n "$CP_PID" ] && kill -0 "$CP_PID" 2>/dev/null; then
      say "deleting every guest the plugin left on createos-local"
      (cd "$RUN_DIR" && "$ROOT/$VENV_LANGFLOW/bin/createos-langflow" reap --yes --include-active --prefix lf-) || unclean=1
      say "stopping createos-local (pid $CP_PID)"
      kill -TERM -- "-$CP_PID" 2>/dev/null
      for _ in $(seq 1 20); do kill -0 "$CP_PID" 2>/dev/null || break; sleep 0.5; done
      if kill -0 "$CP_PID" 2>/dev/null; then kill -KILL -- "-$CP_PID" 2>/dev/null; unclean=1; fi
    fi
  elif [ "$REAL_PLANE" = 1 ]; then
    # Another Langflow may share this key: list, never delete, guests on a real control plane.
    say "guests the plugin left on $CREATEOS_SANDBOX_BASE_URL (not deleted: they may not be this run's):"
    "$ROOT/$VENV_LANGFLOW/bin/createos-langflow" reap
    say "delete them with: createos-langflow reap --yes   (see docs/operations.md)"
  fi
  if [ -n "$STOPPED" ]; then  # a stop asked for (Ctrl-C, SIGTERM): 0 when it went cleanly
    if [ "$unclean" = 0 ]; then say "stopped cleanly"; rc=0; else say "stopped, but not cleanly (see above)"; rc=1; fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'STOPPED=INT; exit 130' INT
trap 'STOPPED=TERM; exit 143' TERM
trap 'exit 129' HUP
PARENT=$PPID  # `make run`: make dies of a signal sent to it alone; then we stop too

# --- 2. the control plane ------------------------------------------------------------------------
if [ -n "${CREATEOS_SANDBOX_API_KEY:-}" ] && [ -n "${CREATEOS_SANDBOX_BASE_URL:-}" ]; then
  say "using the control plane at $CREATEOS_SANDBOX_BASE_URL (CREATEOS_SANDBOX_API_KEY and _BASE_URL are set)"
  REAL_PLANE=1
else
  if [ -n "${CREATEOS_SANDBOX_API_KEY:-}${CREATEOS_SANDBOX_BASE_URL:-}${CREATEOS_API_KEY:-}" ]; then
    say "only one of CREATEOS_SANDBOX_API_KEY / CREATEOS_SANDBOX_BASE_URL is set: set both to use a real control plane"
  fi
  LOCAL_PLANE=1
  port_free "$CREATEOS_LOCAL_PORT" || { say "port $CREATEOS_LOCAL_PORT is taken: createos-local picks a free one"; CREATEOS_LOCAL_PORT=0; }
  rm -f "$RUN_DIR/createos-local.port"
  (cd "$RUN_DIR" && CREATEOS_LOCAL_API_KEY=$LOCAL_API_KEY exec setsid "$ROOT/$VENV_LANGFLOW/bin/createos-local" \
    --host 127.0.0.1 --port "$CREATEOS_LOCAL_PORT" --state-dir "$RUN_DIR/createos-local" \
    --port-file "$RUN_DIR/createos-local.port" >"$RUN_DIR/createos-local.log" 2>&1) &
  CP_PID=$!
  echo "$CP_PID" >"$RUN_DIR/createos-local.pid"
  for _ in $(seq 1 100); do [ -s "$RUN_DIR/createos-local.port" ] && break; kill -0 "$CP_PID" || break; sleep 0.1; done
  [ -s "$RUN_DIR/createos-local.port" ] || { cat "$RUN_DIR/createos-local.log" >&2; echo "createos-local did not start" >&2; exit 1; }
  CREATEOS_SANDBOX_BASE_URL="http://127.0.0.1:$(cat "$RUN_DIR/createos-local.port")"
  CREATEOS_SANDBOX_API_KEY=$LOCAL_API_KEY
  unset CREATEOS_API_KEY
  # devbox:1 is a plain image (no lfx); the flow executor's guests use the lfx template, as a
  # CreateOS deployment uses a template built with Langflow installed
  export CREATEOS_EXECUTOR_ROOTFS=${CREATEOS_EXECUTOR_ROOTFS:-langflow-lfx}
  say "createos-local (offline control plane, guests in bubblewrap) on $CREATEOS_SANDBOX_BASE_URL, log $RUN_DIR/createos-local.log"
fi
export CREATEOS_SANDBOX_API_KEY CREATEOS_SANDBOX_BASE_URL

# --- 3. Langflow -----------------------------------------------------------------------------------
export LANGFLOW_SANDBOX_BACKEND_PLUGINS=createos LANGFLOW_SANDBOX_BACKEND=createos
if [ "$LOCAL_PLANE" = 1 ]; then
  export CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true
  say "CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION=true: createos-local's guests are Linux namespaces on this"
  say "  machine's kernel, not microVMs; the backend tells lfx so, and lfx refuses, unless this accepts it."
  export LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true
  say "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true: with egress off a CreateOS guest can still"
  say "  reach 169.254.0.0/16 (the metadata range), so the backend refuses to run until you acknowledge it."
  say "  createos-local gives an egress-off guest no network at all (loopback only), so nothing is"
  say "  reachable here and the acknowledgement costs nothing. Decide for yourself on a real control plane."
elif [ "${LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS:-false}" != true ] && [ "${LANGFLOW_SANDBOX_ALLOW_NETWORK:-false}" != true ]; then
  say "note: LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS is not true, so the Python Interpreter node's runs"
  say "  are refused (egress off still leaves 169.254.0.0/16 reachable on CreateOS). Read docs/network-rules.md,"
  say "  then export LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true if that is acceptable."
fi
case "${EXECUTOR:-}" in
  "" | in-process) ;;
  createos)
    export LANGFLOW_EXECUTOR_KIND=createos
    export CREATEOS_EXECUTOR_WARM_POOL=${CREATEOS_EXECUTOR_WARM_POOL:-2}
    say "whole-flow executor: createos (/api/v1/run and lfx run execute each flow in a CreateOS guest;"
    say "  a warm pool of $CREATEOS_EXECUTOR_WARM_POOL guests, CREATEOS_EXECUTOR_WARM_POOL)" ;;
  *) echo "EXECUTOR must be createos or in-process, not '$EXECUTOR'" >&2; exit 2 ;;
esac
export LANGFLOW_AUTO_LOGIN=${LANGFLOW_AUTO_LOGIN:-true}
# What this Langflow gets, for `createos-langflow doctor/reap --env-file` (the key is in it: 0600)
(
  umask 077
  {
    echo "# written by make run for createos-langflow --env-file; holds the control plane's key"
    for name in CREATEOS_SANDBOX_API_KEY CREATEOS_SANDBOX_BASE_URL LANGFLOW_SANDBOX_BACKEND_PLUGINS \
      LANGFLOW_SANDBOX_BACKEND LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS CREATEOS_SANDBOX_ACCEPT_LOCAL_ISOLATION \
      LANGFLOW_EXECUTOR_KIND \
      CREATEOS_EXECUTOR_ROOTFS CREATEOS_EXECUTOR_WARM_POOL; do
      if [ -n "${!name:-}" ]; then printf 'export %s=%q\n' "$name" "${!name}"; fi
    done
  } >"$RUN_DIR/createos.env"
)
export LANGFLOW_CONFIG_DIR=${LANGFLOW_CONFIG_DIR:-$RUN_DIR/langflow}
export LANGFLOW_DATABASE_URL=${LANGFLOW_DATABASE_URL:-sqlite:///$RUN_DIR/langflow/langflow.db}
export LITELLM_LOCAL_MODEL_COST_MAP=${LITELLM_LOCAL_MODEL_COST_MAP:-True}  # no fetch (and retries) at start
mkdir -p "$LANGFLOW_CONFIG_DIR"
# Started from $RUN_DIR: from the checkout, its gunicorn workers would import the source tree's
# package (and its in-place .so) instead of the one installed in $VENV_LANGFLOW.
# Python may write .pyc files: the first start compiles Langflow, later starts are faster.
(cd "$RUN_DIR" && exec env -u PYTHONDONTWRITEBYTECODE PYTHONFAULTHANDLER=1 setsid "$ROOT/$VENV_LANGFLOW/bin/langflow" run \
  --host "$LANGFLOW_HOST" --port "$LANGFLOW_PORT" --no-open-browser >"$RUN_DIR/langflow.log" 2>&1) &
LF_PID=$!
echo "$LF_PID" >"$RUN_DIR/langflow.pid"
URL="http://$LANGFLOW_HOST:$LANGFLOW_PORT"
say "starting Langflow on $URL (log $RUN_DIR/langflow.log); the first start takes a minute or two"
start=$(date +%s)
until curl -sf "$URL/health_check" >/dev/null 2>&1; do
  if ! kill -0 "$LF_PID" 2>/dev/null; then
    tail -n 40 "$RUN_DIR/langflow.log" >&2
    echo "Langflow exited while starting (log above, whole log in $RUN_DIR/langflow.log)" >&2
    exit 1
  fi
  if [ $(( $(date +%s) - start )) -ge "$LANGFLOW_START_TIMEOUT" ]; then
    tail -n 40 "$RUN_DIR/langflow.log" >&2
    echo "Langflow did not answer $URL/health_check within $LANGFLOW_START_TIMEOUT s" >&2
    exit 1
  fi
  sleep 1
done
say "Langflow answered after $(( $(date +%s) - start )) s"

FLOW_ID=$("$PY" -m langflow_sandbox_createos.starter --url "$URL" --print-id)
cat <<EOF

  Langflow is running with the CreateOS plugin. Open the starter flow:

      $URL/flow/$FLOW_ID

  Python Interpreter -> runs on a CreateOS microVM through the sandbox backend
  CreateOS Sandbox   -> the component; its Results name the guest (sandbox_id)
  Open the Playground (or press play on a node): each output names the guest it ran on.

  Control plane: $CREATEOS_SANDBOX_BASE_URL$([ "$LOCAL_PLANE" = 1 ] && echo " (createos-local, X-Api-Key: $LOCAL_API_KEY)")
  Logs: $RUN_DIR/langflow.log$([ "$LOCAL_PLANE" = 1 ] && echo ", $RUN_DIR/createos-local.log")
  Check it: createos-langflow doctor --env-file $RUN_DIR/createos.env
EOF
if [ "${LANGFLOW_EXECUTOR_KIND:-}" = createos ]; then
  cat <<EOF

  The executor (EXECUTOR=createos) runs whole flows through the API, not the canvas: the
  Playground and the play buttons still run in the Langflow process, with the backend and the
  component. To run the starter flow in a CreateOS guest, make an API key (Settings > Langflow
  API Keys) and call:

      curl -X POST $URL/api/v1/run/$FLOW_ID -H "x-api-key: \$LANGFLOW_API_KEY" \\
           -H 'Content-Type: application/json' -d '{"input_value": "hi"}'

  Its Python Interpreter and CreateOS Sandbox nodes then run on this server's backend and
  component engine, asked for by the flow's guest (the key never enters it). Each run logs
  "CreateOS executor: flow ... ran on guest ..." in $RUN_DIR/langflow.log.
EOF
fi
cat <<EOF
  Stop: Ctrl-C (stops both servers, deletes leftover guests and says what is left)

EOF
while kill -0 "$LF_PID" 2>/dev/null; do
  if ! kill -0 "$PARENT" 2>/dev/null; then
    say "the parent process ($PARENT) is gone: stopping"
    exit 129
  fi
  sleep 1 &
  wait $! 2>/dev/null || true  # a trapped signal interrupts this wait at once
done
say "Langflow exited (log $RUN_DIR/langflow.log)"
