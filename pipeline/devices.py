"""Devices and precisions, resolved one way for every part that runs a model (S3D features, the speech
backends, the trainer): `auto` is a GPU when this machine has one, else the CPU.

`precision: auto` means, everywhere, the fastest precision measured to keep a part's results: bf16
autocast on a GPU for every model; on the CPU, bf16 for S3D's inference (3-4x faster, features within
cosine 0.9999 of float32) and float32 for training (bf16 matmuls in the backward pass are slower there).
A CPU without bf16 instructions (AVX-512 BF16 or AMX) emulates them: S3D in bf16 was about 60x slower than
in float32 on an AMD EPYC with AVX2 (`make bench-features`, --compare-precision), so `auto` is float32 there."""

from __future__ import annotations

from pipeline import registry
from pipeline.config_fields import ConfigError


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cuda_device_count(library: str = "torch") -> int:
    """The CUDA GPUs this process can use (CUDA_VISIBLE_DEVICES applies), as `library` sees them: torch,
    or ctranslate2 (faster-whisper), whose build may lack CUDA where torch's has it."""
    if library == "ctranslate2":
        import ctranslate2

        return ctranslate2.get_cuda_device_count()
    import torch

    return torch.cuda.device_count()


def resolve(name: str, local_rank: int = 0):
    """`auto`, `cpu`, `cuda` or `cuda:N` as a torch.device; plain `cuda` is this process's local rank's GPU.
    A GPU asked for on a machine without one is an error naming the setting's value."""
    import torch

    if name == "auto":
        name = "cuda" if cuda_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda" and not cuda_available():
        raise RuntimeError(f"device {name} was asked for, but CUDA is not available on this machine")
    return device


def resolve_name(name: str) -> str:
    """`auto` as `cuda` or `cpu`, for libraries that take a device by name (CTranslate2)."""
    return ("cuda" if cuda_available() else "cpu") if name == "auto" else name


def cpu_computes_bf16() -> bool:
    """Whether this CPU has bf16 instructions that oneDNN uses (AVX-512 BF16 or AMX), rather than emulating them."""
    import torch

    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def autocast_dtype(precision: str, device, *, cpu_auto: str):
    """The autocast dtype (None: float32) of `precision` on `device`; `cpu_auto` is what auto means on the
    CPU for the caller's kind of work, where the CPU computes bf16 (see the module docstring)."""
    import torch

    if precision == "auto":
        if device.type == "cuda":
            precision = "bfloat16"
        else:
            precision = cpu_auto if cpu_auto != "bfloat16" or cpu_computes_bf16() else "float32"
    return {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]


# commands that are not stages, and the device keys they run a model on
COMMAND_DEVICE_KEYS = {"eval": ("train.device",)}


def check_devices(cfg, command: str) -> None:
    """The GPUs the device keys of `command` (its registry record's, or COMMAND_DEVICE_KEYS') name must
    exist on this machine: none without CUDA, an index below the number of GPUs with it. Checked by the
    command that uses them (not by `submit` on a login node, or a Ray driver whose workers have the GPUs),
    at load: a wrong one would fail every shard."""
    keys = (
        registry.BY_NAME[command].device_keys if command in registry.BY_NAME else COMMAND_DEVICE_KEYS.get(command, ())
    )
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if not value.startswith("cuda"):  # (a cuda decode.device without torchcodec is refused at load)
            continue
        library = "ctranslate2" if section == "asr" and cfg.asr.backend == "faster-whisper" else "torch"
        count = cuda_device_count(library)
        index = int(value.split(":")[1]) if ":" in value else 0
        if count == 0:
            which = " that CTranslate2 (faster-whisper) can use" if library == "ctranslate2" else ""
            raise ConfigError(f"config error: {key}={value}, but this machine has no CUDA GPU{which}: use auto or cpu")
        if index >= count:
            raise ConfigError(
                f"config error: {key}={value}, but this machine has {count} GPU(s): "
                f"cuda:0{f' to cuda:{count - 1}' if count > 1 else ''}"
            )
