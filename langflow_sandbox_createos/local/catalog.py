"""The shape and rootfs catalogs (spec sections 5.2 and 5.3)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DISK_MIB = 10240
DEFAULT_ROOTFS = "devbox:1"


@dataclass(frozen=True)
class Shape:
    id: str
    vcpu: int
    mem_mib: int
    default_disk_mib: int = DEFAULT_DISK_MIB

    def as_json(self) -> dict[str, int | str]:
        return {
            "id": self.id,
            "vcpu": self.vcpu,
            "mem_mib": self.mem_mib,
            "default_disk_mib": self.default_disk_mib,
        }


SHAPES: dict[str, Shape] = {
    s.id: s
    for s in (
        Shape("s-1vcpu-256mb", 1, 256),
        Shape("s-1vcpu-1gb", 1, 1024),
        Shape("s-2vcpu-2gb", 2, 2048),
        Shape("s-2vcpu-4gb", 2, 4096),
        Shape("s-4vcpu-4gb", 4, 4096),
        Shape("s-4vcpu-8gb", 4, 8192),
        Shape("s-4vcpu-16gb", 4, 16384),
    )
}
