"""Where training runs: this process's rank among `world_size` (torchrun sets RANK and WORLD_SIZE), its
device and threads, and the autocast its forward passes use (bf16 on GPU by default, float32 on CPU;
pipeline/devices.py). Rank 0 alone writes files and decides for all (`on_rank_zero`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline import devices, threads
from pipeline.config import ConfigError
from pipeline.executors.dispatch import env_int


@dataclass
class Runtime:
    rank: int
    world_size: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


resolve_device = devices.resolve


def autocast(device: torch.device, precision: str):
    """Training's autocast: bf16 on GPU by default, float32 on CPU (pipeline/devices.py)."""
    dtype = devices.autocast_dtype(precision, device, cpu_auto="float32")
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def start_runtime(device_name: str, num_threads: int = 0) -> tuple[Runtime, bool]:
    """(runtime, whether this call started the process group); torchrun sets RANK and WORLD_SIZE."""
    world_size = env_int("WORLD_SIZE", 1, minimum=1)
    rank, local_rank = env_int("RANK", 0), env_int("LOCAL_RANK", 0)
    if rank >= world_size:
        raise ConfigError(f"environment error: RANK={rank} must be below WORLD_SIZE={world_size}")
    device = resolve_device(device_name, local_rank)
    threads.set_torch_threads(num_threads)  # 0: this rank's share of the task's CPUs (pipeline/threads.py)
    started = False
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        started = True
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    return Runtime(rank, world_size, device), started


def on_rank_zero(runtime: Runtime, check, refusal: type[Exception]):
    """Run `check` on rank 0 only (hashing a checkpoint's files once rather than once per process, taking a
    lock) and give every rank its verdict: its result, or the `refusal` it raised, raised on every rank."""
    verdict: list = [None, None]
    if runtime.main:
        try:
            verdict[1] = check()
        except refusal as error:
            verdict[0] = str(error)
    if runtime.distributed:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise refusal(verdict[0])
    return verdict[1]
