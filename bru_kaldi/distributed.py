"""Distributed data parallel training (``torchrun``): this process's place in the job and the few
collective operations the training loop needs. A plain ``python run_exp.py`` is rank 0 of 1, and
then every method here is free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class Distributed:
    """This process's place in a ``torchrun`` job (rank 0 of 1 when run as a plain script).

    Every rank reads the same batches in the same order (same seeds) and trains on its share of the
    rows of each, ``rank::world``; gradients are averaged by DDP and metrics summed with :meth:`sum`.
    Only rank 0 writes files.
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls, device_type: str) -> "Distributed":
        """Join the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1): NCCL on CUDA, gloo on the CPU."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))

    def share(self, batch):
        """This rank's rows of a global batch; ``None`` when the batch has fewer rows than ranks."""
        if self.world == 1:
            return batch
        rows = slice(self.rank, None, self.world)
        return batch.select(rows) if self.rank < len(batch.keys) else None

    def sum(self, values: Sequence[float]) -> list[float]:
        """Sum ``values`` over all ranks (float64)."""
        if self.world == 1:
            return list(values)
        import torch.distributed as dist

        tensor = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
