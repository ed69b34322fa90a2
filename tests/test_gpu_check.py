"""scripts.ops.gpu_check on a machine without a GPU: it says so and exits 2 before starting anything (the
checks themselves run only on a GPU node; their numbers go in the issue notes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run the real checks instead")
def test_gpu_check_without_cuda_exits_2_with_a_clear_message(capsys):
    from scripts.ops.gpu_check import main

    assert main(["--only", "faiss"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
