"""A world-size-1 gloo process group for in-process tests of distributed code (pipelining, FSDP2).

Import ``process_group`` into a test module: it is module-scoped and autouse there."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module", autouse=True)
def process_group():
    if dist.is_initialized():
        yield
        return
    path = tempfile.mktemp(prefix="tf_pg_")
    dist.init_process_group("gloo", store=dist.FileStore(path, 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    if os.path.exists(path):
        os.remove(path)
