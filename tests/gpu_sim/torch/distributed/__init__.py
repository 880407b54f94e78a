"""A stand-in for torch.distributed (see ../__init__.py): a group that every
rank joins at once, and a first collective that waits, as NCCL's communicator
set-up does, until every rank has called it; nothing else is modelled."""

import os


def init_process_group(backend, init_method=None, rank=0, world_size=1):
    pass


def ncclCommInitRank():
    """Where the real first collective waits for a rank that never joins."""
    read, _ = os.pipe()
    while True:
        os.read(read, 1)


def all_reduce(tensor):
    ncclCommInitRank()
