"""host_to_device.to_device: host data reaches the device with its values and dtype, and on CUDA
without a synchronising copy (a blocking copy from pageable memory waits for every queued kernel)."""
from __future__ import annotations

import pytest
import torch

from seed_tot.engine.host_to_device import pinnable, to_device


def test_lists_become_tensors_of_the_asked_dtype_and_tensors_keep_theirs():
    ids = to_device([[3, 1, 4]], "cpu")
    assert ids.dtype == torch.long and ids.tolist() == [[3, 1, 4]]
    uniforms = to_device([0.25, 0.5], torch.device("cpu"), torch.float64)
    assert uniforms.dtype == torch.float64 and uniforms.tolist() == [0.25, 0.5]
    mask = torch.tensor([[True, False]])
    assert torch.equal(to_device(mask, "cpu"), mask) and to_device(mask, "cpu").dtype == torch.bool


def test_a_broadcast_is_staged_as_a_compact_copy_with_its_values():
    # pool_block_masks' masks can be views from expand(): pinning writes each element, and torch
    # refuses to write through a view whose elements share one location (seen on an H200, 2026-11-28)
    broadcast = torch.tensor([True, False, True]).expand(4, 3)
    staged = pinnable(broadcast)
    assert staged.is_contiguous() and staged.untyped_storage().nbytes() == 12
    assert torch.equal(staged, broadcast)
    compact = torch.arange(6).view(2, 3)
    assert pinnable(compact) is compact  # nothing copied where nothing is shared


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_broadcast_mask_reaches_the_device():
    mask = to_device(torch.tensor([[True, False]]).expand(8, 2), "cuda")
    assert mask.shape == (8, 2) and mask.tolist() == [[True, False]] * 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_host_data_is_copied_without_a_synchronising_copy():
    torch.cuda.set_sync_debug_mode("error")  # a synchronising CUDA call raises
    try:
        ids = to_device(list(range(1000)), "cuda")
        mask = to_device(torch.ones(64, 64, dtype=torch.bool), "cuda")
        again = to_device(ids, "cuda")  # already there: no copy at all
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert ids.device.type == "cuda" and ids.tolist() == list(range(1000))
    assert bool(mask.all()) and again.data_ptr() == ids.data_ptr()
