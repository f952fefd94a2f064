"""Each guest's network: a namespace of its own, a NAT like a VM's, and CreateOS's egress rules.

A CreateOS guest is a VM on a network of its own that reaches the internet through the
provider's NAT, never the host's loopback. createos-local gives each guest the same shape:

* **A network namespace for the guest's whole life**, made by the server (so it belongs to the
  host's user namespace: the guest, root only in a user namespace of its own, cannot change its
  addresses, routes or rules). The guest's PID 1 and every exec run in it. It holds only a
  loopback until the guest's egress needs a way out.
* **slirp4netns as the NAT** (Debian's ``slirp4netns``): libslirp, the user-mode network stack
  QEMU gives a VM, attached to a tap device in the guest's namespace. It turns the guest's
  connections into ordinary sockets of a host process, so the host needs no IP forwarding, no
  bridge and no firewall rule of its own; with ``--disable-host-loopback`` the gateway address
  does not lead to the host's loopback. It runs as root only to open the tap device, then drops
  every capability and confines itself (``--enable-sandbox --enable-seccomp``), and it exits
  when the server does (``--exit-fd``).
* **nftables rules in the guest's namespace** (Debian's ``nftables``), on its output hook:
  the host's own addresses (every local address of the host, refreshed while the guest lives),
  ``127.0.0.0/8``, the NAT's gateway and the link-local range are refused whatever the egress;
  then the egress rules decide: allow-all accepts the rest, address and CIDR rules (``IP``,
  ``IP:port``, ``a.b.c.d/n``) accept what they name, and everything else is refused. Hostname
  rules (``host``, ``host:port``, ``*.host``) are stored and echoed but not enforced, as the real
  service does; a rule set of hostnames only therefore reaches nothing. IPv6 has no route out
  (only the guest's own ``::1``).

Refusals are immediate: TCP gets a reset (``ECONNREFUSED``), anything else an ICMP
administratively-prohibited (``EHOSTUNREACH``/``EACCES``), never a silent drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .helpers import helper_env, tool
from .mounts import umount

log = logging.getLogger("createos.local")

TOOLS = {"unshare": "util-linux", "nsenter": "util-linux", "ip": "iproute2"}
TOOLS.update({"nft": "nftables", "slirp4netns": "slirp4netns"})
TABLE = "createos"
TAP = "tap0"
NAT_GATEWAY = "10.0.2.2"  # slirp4netns's gateway (with --disable-host-loopback: leads nowhere)
GUEST_ADDRESS = "10.0.2.100"
# refused whatever the egress: the host's loopback, "this network", the NAT's gateway, the
# link-local range (the host's own metadata service, on a cloud VM), multicast and broadcast
ALWAYS_REFUSED = ("0.0.0.0/8", "127.0.0.0/8", f"{NAT_GATEWAY}/32", "169.254.0.0/16", "224.0.0.0/3")
SLIRP_READY_SECONDS = 10.0


def missing_tools() -> list[str]:
    """The Debian packages to install for guest networks, empty when all are present."""
    return sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})


@dataclass(frozen=True)
class EgressPolicy:
    """A guest's egress rules as CreateOS applies them."""

    rules: tuple[str, ...]
    allow_all: bool
    networks: tuple[ipaddress.IPv4Network, ...] = ()  # IP and CIDR rules
    ports: tuple[tuple[ipaddress.IPv4Address, int], ...] = ()  # IP:port rules
    unenforced: tuple[str, ...] = ()  # hostname rules (and anything else): echoed, not enforced

    @classmethod
    def parse(cls, rules: list[str] | None) -> EgressPolicy:
        rules = list(rules or [])
        if not rules or rules == ["*"]:  # absent, [] and ["*"] mean allow-all on CreateOS
            return cls(tuple(rules), allow_all=True)
        networks: list[ipaddress.IPv4Network] = []
        ports: list[tuple[ipaddress.IPv4Address, int]] = []
        unenforced: list[str] = []
        for rule in rules:
            parsed = _parse_rule(rule.strip())
            if isinstance(parsed, ipaddress.IPv4Network):
                networks.append(parsed)
            elif parsed is not None:
                ports.append(parsed)
            else:
                unenforced.append(rule)
        return cls(tuple(rules), False, tuple(networks), tuple(ports), tuple(unenforced))

    @property
    def needs_nat(self) -> bool:
        """Whether anything beyond the guest's own loopback can be reached."""
        return self.allow_all or bool(self.networks or self.ports)


def _parse_rule(rule: str) -> ipaddress.IPv4Network | tuple[ipaddress.IPv4Address, int] | None:
    """An IPv4 address or CIDR as a network, ``IP:port`` as a pair, anything else None."""
    with contextlib.suppress(ValueError):
        return ipaddress.IPv4Network(rule, strict=False)
    address, sep, port = rule.rpartition(":")
    if sep and port.isdigit() and 0 < int(port) < 65536:
        with contextlib.suppress(ValueError):
            return ipaddress.IPv4Address(address), int(port)
    return None


def host_addresses() -> frozenset[str]:
    """Every IPv4 address local to the host's network namespace (the ``LOCAL`` entries of the
    kernel's FIB, secondary addresses and every interface included)."""
    found: set[str] = set()
    last = ""
    with contextlib.suppress(OSError), open("/proc/net/fib_trie") as fh:
        for line in fh:
            stripped = line.strip()
            if stripped.startswith(("|--", "+--")):
                last = stripped[3:].strip().split("/")[0]
            elif stripped == "/32 host LOCAL" and last:
                found.add(last)
    return frozenset(found)


def ruleset(policy: EgressPolicy, host: frozenset[str]) -> str:
    """The nft script that replaces the guest's table in one transaction."""
    refused = sorted({*ALWAYS_REFUSED, *(f"{a}/32" for a in host)})
    allow: list[str] = []
    if policy.allow_all:
        allow.append("accept")
    if policy.networks:
        allow.append(f"ip daddr {{ {', '.join(str(n) for n in policy.networks)} }} accept")
    for address, port in policy.ports:
        allow.append(f"ip daddr {address} meta l4proto {{ tcp, udp }} th dport {port} accept")
    lines = [
        f"add table inet {TABLE}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        "  set refused {",
        "    type ipv4_addr; flags interval; auto-merge;",
        f"    elements = {{ {', '.join(refused)} }}",
        "  }",
        "  chain output {",
        "    type filter hook output priority 0; policy drop;",
        '    oif "lo" accept',
        "    meta nfproto ipv6 jump refuse",
        "    ip daddr @refused jump refuse",
        *(f"    {rule}" for rule in allow),
        "    jump refuse",
        "  }",
        "  chain refuse {",
        "    meta l4proto tcp reject with tcp reset",
        "    reject with icmpx type admin-prohibited",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


class NetworkError(OSError):
    """The guest's network could not be set up."""


async def _run(*argv: str, stdin: bytes | None = None) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=helper_env(),
    )
    _, err = await proc.communicate(stdin)
    if proc.returncode != 0:
        raise NetworkError(f"{argv[0]} failed ({proc.returncode}): {err.decode(errors='replace').strip()}")


class GuestNetwork:
    """One guest's network namespace (bound to ``path``, a file in the server's private mount
    namespace), its rules and its NAT."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.applied: str | None = None  # the nft script now in force
        self.policy: EgressPolicy | None = None
        self._slirp: asyncio.subprocess.Process | None = None
        self._slirp_exit_w = -1  # closing it ends slirp4netns
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def nat_running(self) -> bool:
        return self._slirp is not None and self._slirp.returncode is None

    def enter_argv(self) -> list[str]:
        """The prefix that runs a command in this namespace (as root: nsenter, then the rest)."""
        return [tool("nsenter"), f"--net={self.path}", "--"]

    async def create(self) -> None:
        """Make the namespace, with only its loopback up and every other destination refused."""
        self.path.touch(mode=0o600)
        script = ruleset(EgressPolicy((), allow_all=False), host_addresses())
        setup = "ip link set lo up && echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start && nft -f -"
        try:
            await _run(tool("unshare"), f"--net={self.path}", "sh", "-c", setup, stdin=script.encode())
        except BaseException:
            with contextlib.suppress(OSError):
                umount(self.path)
            raise
        self.applied = script

    async def apply(self, egress: Callable[[], list[str] | None], host: frozenset[str]) -> None:
        """Bring the rules in line with the guest's egress (read here, under the lock, so the
        last writer's rules win whatever order the callers came in) and the host's current
        addresses, starting the NAT the first time anything beyond loopback may be reached.
        The rules go in before the NAT, so nothing is reachable before it is allowed. They hold
        for every process of the guest from the moment ``nft`` returns; a connection already
        open to a destination they now refuse is cut at the next packet the guest sends on it
        (refused like a new one: its socket is reset). Fails closed: when the new rules cannot
        be loaded, the guest is left refusing everything."""
        async with self._lock:
            if self._closed:
                raise NetworkError("the guest is being deleted")
            policy = EgressPolicy.parse(egress())
            script = ruleset(policy, host)
            if script != self.applied:
                try:
                    await _run(*self.enter_argv(), tool("nft"), "-f", "-", stdin=script.encode())
                except NetworkError:
                    await self._refuse_everything(host)
                    raise
                self.applied = script
            self.policy = policy
            if policy.needs_nat and not self.nat_running:
                await self._start_nat()

    async def _refuse_everything(self, host: frozenset[str]) -> None:
        """Deny-all, after new rules failed to load: never leave the guest with wider rules
        than it was given (when even that fails, its NAT is stopped: nothing leaves then)."""
        script = ruleset(EgressPolicy((), allow_all=False), host)
        self.policy = None
        self.applied = None
        try:
            await _run(*self.enter_argv(), tool("nft"), "-f", "-", stdin=script.encode())
        except NetworkError:
            log.exception("could not load deny-all rules into %s; stopping its NAT", self.path)
            self._stop_nat()
            return
        self.applied = script

    async def _start_nat(self) -> None:
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        os.set_inheritable(exit_w, False)
        argv = [tool("slirp4netns"), "--configure", "--mtu=65520", "--disable-host-loopback"]
        argv += ["--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}"]
        argv += ["--netns-type=path", str(self.path), TAP]
        log_path = self.path.with_name("nat.log")  # beside the namespace, out of the guest's root
        try:
            with open(log_path, "ab") as log_file:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log_file,
                    pass_fds=(ready_w, exit_r),
                    start_new_session=True,
                    env=helper_env(),  # not the server's: it holds the API key
                )
        except OSError:
            os.close(exit_w)
            raise
        finally:
            os.close(ready_w)
            os.close(exit_r)
        try:
            ready = await asyncio.wait_for(asyncio.to_thread(os.read, ready_r, 1), SLIRP_READY_SECONDS)
        except asyncio.TimeoutError:
            ready = b""
        finally:
            os.close(ready_r)
        if ready != b"1":
            os.close(exit_w)
            err = b""
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(OSError):
                err = log_path.read_bytes()[-2048:]
            raise NetworkError(f"slirp4netns did not start: {err.decode(errors='replace').strip()}")
        self._slirp, self._slirp_exit_w = proc, exit_w
        if self._closed:  # deleted while it started
            self.close()

    def close(self) -> None:
        """Stop the NAT (the namespace itself goes when its file is unmounted). Idempotent."""
        self._closed = True
        self._stop_nat()

    def _stop_nat(self) -> None:
        if self._slirp_exit_w >= 0:
            os.close(self._slirp_exit_w)
            self._slirp_exit_w = -1
        if self._slirp is not None and self._slirp.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._slirp.send_signal(signal.SIGKILL)
        self._slirp = None

    async def read_back(self) -> str:
        """The rules as the kernel holds them (``nft list table``), for tests and the admin API."""
        proc = await asyncio.create_subprocess_exec(
            *self.enter_argv(),
            tool("nft"),
            "list",
            "table",
            "inet",
            TABLE,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=helper_env(),
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise NetworkError(f"nft list failed: {err.decode(errors='replace').strip()}")
        return out.decode()
