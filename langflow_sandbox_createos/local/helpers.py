"""The host tools createos-local starts for its guests, and the one environment they all get.

Per guest the server runs ``unshare``, ``nsenter``, ``ip`` and ``nft`` (its network),
``slirp4netns`` (its NAT, which parses every packet the guest sends), ``setpriv`` and ``bwrap``
(through the launcher shell: its PID 1 and every exec) and ``cp`` (a fork's disk). None of them
inherits the server's environment, which holds ``CREATEOS_LOCAL_API_KEY``: each is started
with ``helper_env()``, a ``PATH`` and nothing else, so a memory bug in one of them (libslirp has
had several) hands a guest nothing of the server's.

Each tool is found once, on the server's own ``PATH`` (where ``network.missing_tools`` and the
isolation probe looked for it at start), and run by that absolute path.
"""

from __future__ import annotations

import functools
import shutil

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# every variable a helper may see (tests/local/test_helper_env.py reads each one's environ)
HELPER_ENV_KEYS = frozenset({"PATH"})


def helper_env() -> dict[str, str]:
    """The whole environment of a helper process: the system ``PATH`` its own lookups (``sh``
    running ``ip`` and ``nft``) need, and nothing of the server's."""
    return {"PATH": SYSTEM_PATH}


@functools.cache
def tool(name: str) -> str:
    """``name``'s absolute path on the server's ``PATH`` (the bare name when it is missing, so
    the failure names it)."""
    return shutil.which(name) or name
