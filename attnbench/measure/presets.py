"""Device presets: usable memory, fixed overhead, peak FLOP/s and memory bandwidth, read from
conf/device/.

The YAML files are the one source (each says where its figures come from); this module only
loads and checks them, and answers the questions the runner asks: how many bytes may a run
use, and can this device run this dtype.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.resources import files

from omegaconf import OmegaConf

DTYPE_NAMES = ("fp32", "fp16", "bf16")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Preset:
    name: str
    gpu: str | None
    total_bytes: int  # what the device reports as its memory
    overhead_bytes: int  # CUDA context and library workspaces, outside torch's allocator
    peak_flops: dict[str, float] = field(default_factory=dict)
    # total_bytes read off this machine at run time (the cpu preset's RAM), not a datasheet
    # figure: a cell's key names "the machine's memory", never these bytes, which differ by
    # kilobytes between two machines of one kind and after a reboot
    machine_memory: bool = False
    # the card's CUDA compute capability ("9.0"): which attention kernel and which cuBLAS
    # workspace the card's run allocates (measure/cuda_layouts.py); None where not known
    compute_capability: str | None = None
    # the datasheet's memory bandwidth, bytes/s: what a decode step not timed on the card is
    # modeled over (measure/roofline.py); None where not known (a CPU: its steps are timed)
    bandwidth: float | None = None

    @property
    def is_gpu(self) -> bool:
        return self.gpu is not None

    @property
    def capability(self) -> tuple[int, int] | None:
        """The compute capability as (major, minor), as ``torch.cuda.get_device_capability``
        gives it; None on a CPU preset or a GPU preset that does not say."""
        return parse_capability(self.compute_capability)

    @property
    def usable_bytes(self) -> int:
        """What torch's allocator may hand out: the device's memory less the fixed overhead."""
        return self.total_bytes - self.overhead_bytes

    def check_dtype(self, dtype: str) -> None:
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPE_NAMES)}; got {dtype!r}")
        if self.is_gpu and dtype not in self.peak_flops:
            raise ValueError(
                f"dtype: {self.name} ({self.gpu}) cannot run {dtype}; allowed: "
                f"{', '.join(self.peak_flops)}"
            )

    def check_ceiling(self, ceiling: int) -> int:
        if not isinstance(ceiling, int) or isinstance(ceiling, bool) or ceiling < 1:
            raise ValueError(f"ceiling: must be a positive number of bytes, got {ceiling!r}")
        if ceiling > self.total_bytes:
            raise ValueError(
                f"ceiling: {ceiling} bytes is above {self.name}'s {self.total_bytes} bytes of "
                "memory"
            )
        return ceiling


def parse_capability(text: str | None) -> tuple[int, int] | None:
    """``"8.0"`` as (8, 0); one line naming the key for anything else."""
    if text is None:
        return None
    major, dot, minor = str(text).partition(".")
    if not (dot and major.isdigit() and minor.isdigit()):
        raise ValueError(
            f"device.compute_capability: must be MAJOR.MINOR as CUDA gives it (7.0, 8.0, 9.0), "
            f"got {text!r}"
        )
    return int(major), int(minor)


def _preset_dir():  # type: ignore[no-untyped-def]
    return files("attnbench.conf") / "device"


def names() -> list[str]:
    return sorted(
        p.name.removesuffix(".yaml") for p in _preset_dir().iterdir() if p.name.endswith(".yaml")
    )


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load(name: str) -> Preset:
    """The preset ``name`` from conf/device/; an unknown name lists the known ones."""
    known = names()
    if name not in known:
        raise ValueError(f"device: unknown preset {name!r}; allowed: {', '.join(known)}")
    raw = OmegaConf.to_container(OmegaConf.load(str(_preset_dir() / f"{name}.yaml")))
    assert isinstance(raw, dict)
    return from_dict(raw)


def from_dict(raw: dict) -> Preset:
    """A preset from its YAML fields (as loaded, or as Hydra composed them)."""
    machine = raw["total_bytes"] is None
    total = host_memory_bytes() if machine else raw["total_bytes"]
    return Preset(
        raw["name"],
        raw["gpu"],
        int(total),
        int(raw["overhead_bytes"]),
        {k: float(v) for k, v in (raw["peak_flops"] or {}).items()},
        machine_memory=machine,
        compute_capability=_capability_text(raw.get("compute_capability")),
        bandwidth=_bandwidth(raw.get("bandwidth")),
    )


def _bandwidth(value: object) -> float | None:
    """Bytes per second, positive, or None; one line naming the key for anything else."""
    if value is None:
        return None
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        out = -1.0
    if isinstance(value, bool) or not out > 0 or out == float("inf"):
        raise ValueError(
            f"device.bandwidth: must be bytes per second above 0 (900e9), got {value!r}"
        )
    return out


def _capability_text(value: object) -> str | None:
    """YAML reads ``9.0`` as a float: the text it was written as, checked."""
    if value is None:
        return None
    text = f"{value:.1f}" if isinstance(value, float) else str(value)
    parse_capability(text)
    return text
