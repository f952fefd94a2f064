"""Rootfs images: the read-only layers a guest's private root is an overlay of.

A guest never sees the host's ``/``. Its root is built from an explicit allowlist:

* ``devbox:1`` (the default, as on CreateOS a plain image): the host's ``/usr`` (system
  binaries, libraries and the system Python, with ``/usr/local`` shown empty), the top-level
  ``bin``/``lib``/``sbin`` symlinks into it, and a minimal ``/etc`` (generated ``passwd``,
  ``group``, ``hosts``, ``hostname``; copies of the dynamic-linker, resolver, CA-certificate,
  alternatives and Python configuration files). Empty ``/root``, ``/home/user``, ``/var``,
  ``/opt``, ``/srv``, ``/mnt``, ``/run``. No lfx, no host Python packages.
* the lfx template (``TEMPLATE_NAME``, id ``TEMPLATE_ID``): ``devbox:1`` plus ``/opt/lfx``, a
  virtual environment of the system Python whose ``site-packages`` is the server's own
  (read-only), so the guest's lfx is the host's lfx. What a CreateOS template built from a
  Dockerfile that installs Langflow gives the executor.
* ``--rootfs NAME=DIR``: DIR as the guest's ``/``.

Every image gets the mount-point layer (``/workspace``, ``/tmp`` sticky, empty ``/proc``,
``/dev``, ``/sys``) on top.

Commands run as root in the guest's user namespace, as on a CreateOS VM. Only that root is
mapped, to a host uid of the guest's own (see ``identity``). The layers createos-local builds
are root's on disk and shown to each guest through an idmapped mount of its namespace (or
chowned to the one shared guest uid, see ``build_images``), so they belong to its root: the
guest owns its ``/etc``, ``/root``, ``/var``, ``/opt``, ``/usr/local`` and the rest, while the
host's ``/usr`` below stays the host's (read-only in the guest).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .catalog import DEFAULT_ROOTFS
from .helpers import SYSTEM_PATH
from .mounts import MS_NODEV, MS_NOSUID, mount

TEMPLATE_NAME = "langflow-lfx"
TEMPLATE_ID = "tpl_" + hashlib.sha256(TEMPLATE_NAME.encode()).hexdigest()[:26]
# the guest's identity inside its user namespace (root, as on a VM; its host uid: identity.py)
GUEST_UID = GUEST_GID = 0
GUEST_HOME = "/root"
TEMPLATE_VENV = "/opt/lfx"

# /etc entries an image needs and that hold nothing of the host's: linker, resolver, CA
# certificates (public), alternatives symlinks, Python's own configuration.
ETC_ALLOWLIST = (
    "alternatives",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "host.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "pip.conf",
    "protocols",
    "resolv.conf",
    "services",
    "ssl/certs",
    "ssl/openssl.cnf",
    "timezone",
)
EMPTY_DIRS = ("root", "home", "var/tmp", "var/lib", "var/cache", "opt", "srv", "mnt", "run", "usr")
USR_LOCAL_DIRS = ("bin", "etc", "games", "include", "lib", "sbin", "share", "src")


@dataclass(frozen=True)
class Image:
    name: str
    description: str
    lowers: tuple[Path, ...]  # the root overlay's lower layers, top first
    usr_lowers: tuple[Path, ...] = ()  # a second overlay at /usr (host /usr at the bottom)
    binds: tuple[tuple[Path, str], ...] = ()  # (host dir, guest path), read-only
    path: str = SYSTEM_PATH
    template_id: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # the image's own environment (a Dockerfile's ENV)
    built: frozenset[Path] = frozenset()  # the layers createos-local made: the guest's root owns them


def _passwd() -> str:
    return (
        f"root:x:{GUEST_UID}:{GUEST_GID}:root:{GUEST_HOME}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )


def _group() -> str:
    return f"root:x:{GUEST_GID}:\nnogroup:x:65534:\n"


def _copy_etc(etc: Path) -> None:
    for rel in ETC_ALLOWLIST:
        src = Path("/etc") / rel
        dst = etc / rel
        if not (src.exists() or src.is_symlink()):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)
    for entry in Path("/etc").glob("python3*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, etc / entry.name, symlinks=True)
    _guest_resolver(etc / "resolv.conf")
    (etc / "passwd").write_text(_passwd())
    (etc / "group").write_text(_group())
    (etc / "hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
    (etc / "hostname").write_text("sandbox\n")


def _guest_resolver(resolv: Path) -> None:
    """A guest is on a network of its own, where the host's loopback is its own: when the host
    resolves through a loopback stub (systemd-resolved's 127.0.0.53), give the guest the stub's
    upstream servers instead, which it reaches through its NAT."""
    try:
        servers = [
            line.split()[1] for line in resolv.read_text().splitlines() if line.startswith("nameserver")
        ]
    except (OSError, IndexError):
        return
    upstream = Path("/run/systemd/resolve/resolv.conf")
    if servers and all(s.startswith("127.") or s == "::1" for s in servers) and upstream.is_file():
        resolv.unlink()
        shutil.copy2(upstream, resolv)


def _mountpoints(layer: Path) -> None:
    for name in ("proc", "dev", "sys", "workspace", "tmp"):
        (layer / name).mkdir(parents=True, exist_ok=True)
    (layer / "tmp").chmod(0o1777)


def _give_to(layer: Path, owner: int) -> None:
    """Make every file of a layer createos-local built ``owner``'s (the one guest uid all guests
    share, when the layers cannot be idmapped per guest)."""
    os.lchown(layer, owner, owner)
    for directory, dirs, files in os.walk(layer):
        for name in (*dirs, *files):
            os.lchown(os.path.join(directory, name), owner, owner)


def _devbox_root(layer: Path) -> None:
    for name in EMPTY_DIRS:
        (layer / name).mkdir(parents=True, exist_ok=True)
    (layer / "root").chmod(0o700)
    (layer / "var/tmp").chmod(0o1777)
    # the merged-/usr symlinks (bin -> usr/bin, ...) exactly as the host has them
    for entry in os.scandir("/"):
        if entry.is_symlink() and os.readlink(entry.path).lstrip("/").startswith("usr/"):
            os.symlink(os.readlink(entry.path), layer / entry.name)
    _copy_etc(layer / "etc")


def _usr_layer(layer: Path) -> None:
    """Shows the host's /usr/local as an empty directory (an opaque directory hides the
    layers below it): what the host installed by hand is not part of the image."""
    local = layer / "local"
    for name in USR_LOCAL_DIRS:
        (local / name).mkdir(parents=True, exist_ok=True)
    os.setxattr(local, "trusted.overlay.opaque", b"y")


PLUGIN_DIR = "/opt/createos-plugin"  # where the template shows this package when it is not in site-packages


def _plugin_outside(site_packages: Path) -> Path | None:
    """This package's directory when the server runs it from outside its site-packages (an
    editable install, a checkout): the template must carry it as a Dockerfile that installs
    the plugin would."""
    package = Path(__file__).resolve().parents[1]
    return None if package.parent == site_packages.resolve() else package


def _template_layer(layer: Path, version: str) -> Path:
    venv = layer / TEMPLATE_VENV.lstrip("/")
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / f"python{version}" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(
        f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {sys.version.split()[0]}\n"
    )
    for name in ("python", "python3", f"python{version}"):
        os.symlink(f"/usr/bin/python{version}", venv / "bin" / name)
    return venv / "lib" / f"python{version}" / "site-packages"


def build_images(
    images_dir: Path, extra: dict[str, Path], in_memory: bool, owner: int | None = None
) -> tuple[dict[str, Image], list[str]]:
    """Lay out every image's layers under ``images_dir`` (on a tmpfs of this process's mount
    namespace when ``in_memory``: ~700 small files and symlinks, which a busy disk makes
    slow); returns the images by name (and template id) and notes on what could not be offered.
    The layers stay root's, for each guest to see through its idmapped mount, unless ``owner``
    (the shared guest uid) is given."""
    shutil.rmtree(images_dir, ignore_errors=True)
    images_dir.mkdir(parents=True)
    if in_memory:
        mount("tmpfs", images_dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0755")
    layers = {name: images_dir / name for name in ("mountpoints", "devbox", "usr", "lfx")}
    for path in layers.values():
        path.mkdir(parents=True)
    _mountpoints(layers["mountpoints"])
    _devbox_root(layers["devbox"])
    _usr_layer(layers["usr"])
    built = frozenset(layers.values())
    devbox = Image(
        name=DEFAULT_ROOTFS,
        description="plain image: system Python, no lfx",
        lowers=(layers["mountpoints"], layers["devbox"]),
        usr_lowers=(layers["usr"], Path("/usr")),
        built=built,
    )
    images = {DEFAULT_ROOTFS: devbox}
    notes: list[str] = []
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = Path(sysconfig.get_paths()["purelib"])
    if Path(f"/usr/bin/python{version}").exists():
        _template_layer(layers["lfx"], version)
        binds = [(site_packages, f"{TEMPLATE_VENV}/lib/python{version}/site-packages")]
        env: tuple[tuple[str, str], ...] = ()
        plugin = _plugin_outside(site_packages)
        if plugin is not None:
            target = f"{PLUGIN_DIR}/{plugin.name}"
            (layers["lfx"] / target.lstrip("/")).mkdir(parents=True)
            binds.append((plugin, target))
            env = (("PYTHONPATH", PLUGIN_DIR),)
        template = Image(
            name=TEMPLATE_NAME,
            description="template: devbox:1 with lfx and this plugin (the server's Python packages, read-only)",
            lowers=(layers["mountpoints"], layers["lfx"], layers["devbox"]),
            usr_lowers=devbox.usr_lowers,
            binds=tuple(binds),
            path=f"{TEMPLATE_VENV}/bin:{SYSTEM_PATH}",
            template_id=TEMPLATE_ID,
            env=env,
            built=built,
        )
        images[TEMPLATE_NAME] = images[TEMPLATE_ID] = template
    else:
        notes.append(f"no template {TEMPLATE_NAME}: the system has no /usr/bin/python{version}")
    if owner is not None:
        for layer in layers.values():
            _give_to(layer, owner)
    for name, directory in extra.items():
        images[name] = Image(
            name=name,
            description=f"directory {directory}",
            lowers=(layers["mountpoints"], directory),
            built=frozenset({layers["mountpoints"]}),
        )
    return images, notes
