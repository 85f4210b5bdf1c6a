"""The GPU arithmetic of `schedule_resources`, pinned against cases computed by hand.

For these cases the model is `custom` with a given parameter count, so activations are negligible
(a few KB) and the numbers are the model states alone: 16 bytes per parameter for mixed-precision
Adam (2 params + 2 grads + 12 optimizer state), partitioned by the ZeRO stage; 80 GiB × 90 % =
72 GiB usable = 77,309,411,328 bytes per GPU.
"""

from __future__ import annotations

import pytest

from renderers.scheduling import SchedulingError, schedule_resources
from specs import Compute, Dataset, Model

DATASET = Dataset.model_validate({
    "apiVersion": "forge.dev/v1alpha1", "kind": "Dataset", "metadata": {"name": "d"},
    "spec": {"source": {"uri": "sklearn://digits", "format": "sklearn"}, "version": "1", "digest": "sha256:" + "a" * 64},
})


def pool(max_gpus: int = 64, min_gpus: int = 1, per_node: int = 8) -> Compute:
    return Compute.model_validate({
        "apiVersion": "forge.dev/v1alpha1", "kind": "Compute", "metadata": {"name": "h100"},
        "spec": {"accelerator": {"type": "nvidia-h100-80gb"}, "gpusPerNode": per_node, "minGpus": min_gpus, "maxGpus": max_gpus},
    })


def model(params: float, zero: int, precision: str = "bf16", offload: str = "none") -> Model:
    strategy = "deepspeed" if zero or offload != "none" else "ddp"
    return Model.model_validate({
        "apiVersion": "forge.dev/v1alpha1", "kind": "Model", "metadata": {"name": "m"},
        "spec": {"datasetRef": "d", "architecture": {"type": "custom", "entrypoint": "x.y:z"}, "parameters": int(params),
                 "precision": precision, "hyperparameters": {"batchSize": 1},
                 "distributed": {"strategy": strategy, "zeroStage": zero, "offload": offload}},
    })


def test_7b_bf16_adam_zero3_fits_one_node() -> None:
    # 7e9 × 16 B = 112 GB: 1 GPU needs 112 GB > 77.3 GB; 2 GPUs need 56 GB ≤ 77.3 GB → 2, rounded to a node of 8.
    s = schedule_resources(model(7e9, 3), DATASET, pool())
    assert (s.gpus, s.nodes, s.gpus_per_node) == (8, 1, 8)
    assert s.resource_name == "nvidia.com/gpu"
    assert s.bytes_per_gpu == pytest.approx(7e9 * 16 / 8, rel=1e-3)  # at the 8 GPUs it gets


def test_7b_zero2_keeps_params_replicated() -> None:
    # ZeRO-2: 2 B params replicated + 14 B / N: N=1 → 112 GB, N=2 → 63 GB ≤ 77.3 GB.
    s = schedule_resources(model(7e9, 2), DATASET, pool())
    assert s.gpus == 8 and s.bytes_per_gpu == pytest.approx(7e9 * (2 + 14 / 8), rel=1e-3)


def test_7b_without_zero_cannot_fit() -> None:
    # ZeRO-0 replicates all 112 GB on every GPU, whatever N.
    with pytest.raises(SchedulingError) as err:
        schedule_resources(model(7e9, 0), DATASET, pool())
    text = str(err.value)
    assert "7.00B parameters" in text and "104.3 GiB per GPU" in text and "72.0 GiB usable" in text


def test_70b_zero3_needs_two_nodes() -> None:
    # 70e9 × 16 B = 1.12 TB; ≤ 77.3 GB per GPU needs N ≥ 14.5 → 16 GPUs = 2 nodes → a PyTorchJob.
    s = schedule_resources(model(70e9, 3), DATASET, pool())
    assert (s.gpus, s.nodes) == (16, 2) and s.multi_node


def test_70b_does_not_fit_a_one_node_pool() -> None:
    with pytest.raises(SchedulingError, match=r"even on 8 GPUs.*maxGpus 8"):
        schedule_resources(model(70e9, 3), DATASET, pool(max_gpus=8))


def test_optimizer_offload_shrinks_the_need() -> None:
    # ZeRO-3 + optimizer offload: (2 + 2) B / N on the GPU for 70B: N=4 → 70 GB ≤ 77.3 GB → 4, rounded to 8.
    s = schedule_resources(model(70e9, 3, offload="optimizer"), DATASET, pool())
    assert s.gpus == 8 and s.nodes == 1


def test_min_gpus_is_respected() -> None:
    s = schedule_resources(model(1e8, 3), DATASET, pool(min_gpus=16))
    assert (s.gpus, s.nodes) == (16, 2)


def test_fp32_adam_is_16_bytes_too() -> None:
    s = schedule_resources(model(3e9, 3, precision="fp32"), DATASET, pool())
    assert s.bytes_per_gpu == pytest.approx(3e9 * 16 / 8, rel=1e-3)
