"""Data-parallel training under torchrun: one process per device, gloo on CPUs, NCCL on GPUs."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from pipeline.core.errors import PipelineError


def init_distributed(device_name: str) -> tuple[int, int, str]:
    """(rank, world size, device name) under torchrun; (0, 1, device_name) otherwise.

    torchrun sets RANK/WORLD_SIZE/LOCAL_RANK; CPUs use gloo, GPUs NCCL with one GPU per
    process (cuda:LOCAL_RANK)."""

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, device_name
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    if use_cuda and local >= torch.cuda.device_count():
        raise PipelineError("torchrun", f"LOCAL_RANK {local} needs cuda:{local} but {torch.cuda.device_count()} "
                                        "CUDA device(s) are visible: lower --nproc-per-node")
    if use_cuda:
        # before anything touches CUDA: else every rank opens a context on GPU 0 (the
        # DataLoader's pin thread, NCCL, bf16 checks all use the current device)
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        if use_cuda:  # binds NCCL to this rank's GPU (barrier and collectives use it)
            dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        else:
            dist.init_process_group("gloo")
    return rank, world, (f"cuda:{local}" if use_cuda else "cpu")
