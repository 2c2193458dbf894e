"""The device the kernels run on: architecture, SM count (get/set), shared-memory and L2 sizes."""

import functools
from dataclasses import dataclass

import torch

from deep_kernels import envs

# sm_90a features (wgmma, setmaxnreg) are what every kernel here is written for.
DEFAULT_ARCH = "90a"

_num_sms_override = None


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    arch: str
    num_sms: int
    smem_per_block_bytes: int
    l2_bytes: int


def has_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


@functools.lru_cache(maxsize=None)
def info(device_index: int = 0) -> DeviceInfo:
    props = torch.cuda.get_device_properties(device_index)
    if (props.major, props.minor) != (9, 0):
        raise RuntimeError(
            f"deep_kernels targets Hopper (compute capability 9.0); device {device_index} "
            f"({props.name}) is {props.major}.{props.minor}"
        )
    return DeviceInfo(
        name=props.name,
        arch=DEFAULT_ARCH,
        num_sms=props.multi_processor_count,
        smem_per_block_bytes=props.shared_memory_per_block_optin,
        l2_bytes=props.L2_cache_size,
    )


def target_arch() -> str:
    """The architecture kernels are compiled for: DK_JIT_ARCH, else the GPU's, else sm_90a."""
    override = envs.get("DK_JIT_ARCH")
    if override:
        return override.removeprefix("sm_")
    if has_gpu():
        return info(torch.cuda.current_device()).arch
    return DEFAULT_ARCH


def set_num_sms(num_sms: int) -> None:
    """Limit the SMs persistent kernels use (e.g. to leave room for communication kernels)."""
    if not isinstance(num_sms, int) or num_sms <= 0:
        raise ValueError(f"num_sms must be a positive int, got {num_sms!r}")
    device_sms = info(torch.cuda.current_device()).num_sms if has_gpu() else num_sms
    if num_sms > device_sms:
        raise ValueError(f"num_sms={num_sms} exceeds the current device's {device_sms} SMs")
    global _num_sms_override
    _num_sms_override = num_sms


def get_num_sms() -> int:
    """SMs used by persistent kernels: set_num_sms(), else DK_NUM_SMS (read once), else all of the device's."""
    if _num_sms_override is not None:
        return _num_sms_override
    from_env = envs.get_once("DK_NUM_SMS")
    if from_env is not None:
        return from_env
    # NOTE: torch._C._cuda_getDevice, not torch.cuda.current_device(): the same value (it initializes CUDA itself)
    # without the Python wrapper's checks, on a path every cached kernel call takes.
    return info(torch._C._cuda_getDevice()).num_sms
