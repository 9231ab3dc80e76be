"""The one device resolver (nmtkit/device.py): the same accepted values for train and generate."""

import pytest
import torch

from nmtkit.device import resolve_device
from nmtkit.errors import UserError


def test_auto_and_cpu():
    assert resolve_device("cpu") == torch.device("cpu")
    want = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device("auto") == want


@pytest.mark.parametrize("name, message", [
    ("tpu", "--device: unknown device 'tpu'"),
    ("meta", "--device: unsupported device type 'meta'"),
])
def test_unknown_devices_name_the_flag(name, message):
    with pytest.raises(UserError, match="^" + message):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_absent_cuda_is_refused(name):
    with pytest.raises(UserError, match=rf"^--device {name}: CUDA is not available"):
        resolve_device(name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_follows_local_rank_and_explicit_index_wins():
    n = torch.cuda.device_count()
    assert resolve_device("cuda", local_rank=n - 1) == torch.device("cuda", n - 1)
    assert resolve_device("cuda:0", local_rank=n - 1) == torch.device("cuda", 0)
    with pytest.raises(UserError, match=f"LOCAL_RANK {n}: only {n} CUDA"):
        resolve_device("cuda", local_rank=n)
