"""Device, AMP and memory-format choices, made once from params."""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

from pipeline.core.config import params_source, switch_on
from pipeline.core.errors import PipelineError

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        dev = _with_index(torch.device("cuda"))
        check_arch(dev)
        return dev
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise PipelineError(params_source("train.device", "predict.device"),
                            f"device: unknown device '{name}'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        # an NVIDIA driver older than this wheel's CUDA also reads as "not available"
        raise PipelineError(params_source("train.device", "predict.device"),
                            f"device '{name}' requested but CUDA is not available (torch {torch.__version__} "
                            f"is built for CUDA {torch.version.cuda}: no GPU, or a driver too old for it)")
    if dev.type == "cuda":
        dev = _with_index(dev)
        check_arch(dev)
    return dev


def _with_index(dev: torch.device) -> torch.device:
    """'cuda' as 'cuda:N' (N the current device): torch.cuda.set_device, Stream and
    other per-device calls reject a CUDA device without an index."""
    return dev if dev.index is not None else torch.device(dev.type, torch.cuda.current_device())


def _arch_runs_on(arch: str, major: int, minor: int) -> bool:
    """Whether a `torch.cuda.get_arch_list()` entry runs on a GPU of compute capability
    major.minor: a binary (sm_XY) on the same major with a minor <= the GPU's, PTX
    (compute_XY) on any GPU at least that capability (JIT-compiled at start)."""
    kind, _, num = arch.partition("_")
    num = num.rstrip("abcdefghijklmnopqrstuvwxyz")  # sm_90a, sm_100f: arch-specific variants
    if not num.isdigit() or len(num) < 2:
        return False
    a_major, a_minor = int(num[:-1]), int(num[-1])
    if kind == "sm":
        return a_major == major and a_minor <= minor
    return kind == "compute" and (a_major, a_minor) <= (major, minor)


def check_arch(dev: torch.device) -> None:
    """A clear error, before any work, when this torch build has no kernels for the GPU
    (a P100/V100 under a wheel built for sm_75+ otherwise fails at the first kernel with
    "no kernel image is available")."""
    archs = torch.cuda.get_arch_list()
    if not archs or torch.version.hip:  # a build that does not say; ROCm names gfx targets
        return
    major, minor = torch.cuda.get_device_capability(dev)
    if not any(_arch_runs_on(a, major, minor) for a in archs):
        raise PipelineError(params_source("train.device", "predict.device"),
                            f"{dev} is {torch.cuda.get_device_name(dev)} (sm_{major}{minor}), but torch "
                            f"{torch.__version__} has kernels for {' '.join(archs)} only: install a torch "
                            "build for this GPU (docs/scaling.md, 'GPU wheels')")


_WARNED: set[tuple[str, str]] = set()


# CPU flags (Linux /proc/cpuinfo) of native bf16 arithmetic: AVX512-BF16's dot products (Intel
# Cooper Lake and later, AMD Zen 4 and later) and AMX's bf16 tiles (Intel Sapphire Rapids and
# later). oneDNN runs bf16 convolutions natively only on these; elsewhere it emulates them.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=4)  # read once a process: validation resolves train.amp every epoch
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags as the kernel lists them (empty where there is no such file:
    macOS, Windows). torch has no question for this: mkldnn's `_is_mkldnn_bf16_supported`
    says yes on any AVX-512 CPU, native bf16 or not."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    return any(f in (cpu_flags() if flags is None else flags) for f in NATIVE_BF16_FLAGS)


def amp_dtype(amp: str, device: torch.device, key: str = "train.amp",
              native_cpu_bf16: bool | None = None) -> torch.dtype | None:
    """The autocast dtype, or None for fp32, for the setting of param `key`.

    `auto`: on CUDA bf16 where native, else fp16. On the CPU, bf16 for training
    (`train.amp`) where the CPU has native bf16 (`NATIVE_BF16_FLAGS`): there the CPU recipe
    trains faster at the same OOF NME; without it oneDNN emulates bf16 and autocast makes
    training far slower, so fp32 (docs/experiments.md, "bf16 by default" and "An AVX2-only
    machine"). CPU inference (`predict.amp`) stays fp32 under `auto`: the bf16 trainings were
    predicted in fp32, and bf16 inference on the CPU has not been measured.
    `native_cpu_bf16` overrides the flag check (tests)."""
    if amp not in ("auto", "on", "off", "bf16", "fp16"):
        raise PipelineError(params_source(key), f"{key.split('.')[-1]} must be auto|on|off|bf16|fp16, got '{amp}'")
    if amp == "off":
        return None
    if amp in ("auto", "on") and device.type == "cuda":
        # native bf16 only (sm_80+): with emulation counted, is_bf16_supported says yes on a
        # T4 or V100, where bf16 convolutions have no fast kernels; fp16 + GradScaler there.
        # It asks the current device: init_distributed makes that each rank's own GPU
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.bfloat16 if native else torch.float16
    native = cpu_has_native_bf16() if native_cpu_bf16 is None else native_cpu_bf16
    if amp == "auto":
        return torch.bfloat16 if device.type == "cpu" and key == "train.amp" and native else None
    if device.type == "cpu" and not native and (amp, device.type) not in _WARNED:
        _WARNED.add((amp, device.type))  # once: validation resolves the setting every epoch
        log.warning("amp=%s on a CPU without native bf16 (no %s flag): autocast is usually far "
                    "slower than fp32 here (oneDNN emulates bf16; amp=auto picks fp32)",
                    amp, " or ".join(NATIVE_BF16_FLAGS))
    return torch.float16 if amp == "fp16" else torch.bfloat16


def describe_device(device: torch.device) -> dict:
    """What a GPU run's report names: the torch build, and on CUDA the GPU (name, capability,
    memory), the wheel's kernels, native bf16 and cuDNN; the dtype `train.amp=auto` picks."""
    res: dict = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "device": str(device)}
    if device.type == "cuda":
        res.update({"device_name": torch.cuda.get_device_name(device),
                    "capability": "%d.%d" % torch.cuda.get_device_capability(device),
                    "arch_list": torch.cuda.get_arch_list(),
                    "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
                    "bf16_with_emulation": torch.cuda.is_bf16_supported(),
                    "cudnn": torch.backends.cudnn.version(), "device_count": torch.cuda.device_count(),
                    "memory_gib": torch.cuda.get_device_properties(device).total_memory / 2 ** 30})
    res["amp_auto"] = str(amp_dtype("auto", device))
    return res


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def use_channels_last(setting: str, device: torch.device) -> bool:
    """NHWC activations: `auto` on CUDA and on the CPU, where oneDNN's convolutions and
    their backward run faster on channels_last tensors (docs/benchmarks.md)."""
    return switch_on(setting, True, "train.channels_last")


def use_compile(setting: str) -> bool:
    """torch.compile the training network: `auto` is off everywhere. On the 2-core CPU the
    cold compile (two graphs: the batch and an epoch's smaller last batch) takes back most or
    all of what the faster epochs save over a fresh run, in fp32 and in bf16 (docs/benchmarks.md;
    docs/experiments.md, "Where the bf16 step goes"). Not measured on CUDA."""
    return switch_on(setting, False, "train.compile")


# Per-rank batches below this make BatchNorm statistics noisy enough to matter (8 GPUs x
# batch 64 leaves 8 faces a rank): SyncBatchNorm then normalises over the global batch.
SYNC_BN_BELOW = 16


def use_sync_bn(setting: str, device: torch.device, world: int, rank_batch: int) -> bool:
    """Whether to convert BatchNorm to SyncBatchNorm: `on` under DDP, `auto` under DDP on
    CUDA with a per-rank batch below SYNC_BN_BELOW. SyncBatchNorm runs on GPUs only (its
    forward refuses CPU tensors), so CPU (gloo) runs keep per-rank statistics."""
    forced = setting == "on"
    if not switch_on(setting, True, "train.sync_bn") or world <= 1:
        return False
    if device.type != "cuda":
        if forced:
            raise PipelineError(params_source("train.sync_bn"), "train.sync_bn=on needs CUDA devices "
                                                                "(SyncBatchNorm does not run on the CPU)")
        return False
    return forced or rank_batch < SYNC_BN_BELOW

