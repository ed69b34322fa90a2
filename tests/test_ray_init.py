"""`cluster.ray_init.local_cluster_options`: what a config asks of the local Ray cluster it starts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.ray_init import local_cluster_options
from configs import load_config
from configs.schema import RayConfig


def test_object_store_gib_becomes_bytes_and_unset_keys_are_left_to_ray():
    assert local_cluster_options(RayConfig(num_cpus=8, object_store_gib=1.5)) == {
        "include_dashboard": False, "num_cpus": 8, "object_store_memory": 1610612736}
    assert local_cluster_options(RayConfig()) == {"include_dashboard": False}


def test_object_store_below_ray_minimum_is_a_config_error():
    with pytest.raises(ValidationError, match="object_store_gib"):
        RayConfig(object_store_gib=0.01)


GEMMA_270M_BF16_BYTES = 536_223_056
"""The converted Gemma 3 270M's `model.safetensors` (bf16): one copy of the weights a sync sends."""


def test_cpu_training_configs_bound_the_object_store():
    """A weight sync holds one copy of the policy's weights; the CPU configs leave room for a second
    (the last sync's, while it is freed) and not for a third (the store never gives /dev/shm back while Ray runs, so every slot it
    ever filled stays in /dev/shm)."""
    cap = load_config("configs/main_cpu.yaml").ray.object_store_gib * 2**30
    assert 2 * GEMMA_270M_BF16_BYTES < cap < 3 * GEMMA_270M_BF16_BYTES
    assert load_config("configs/retrieval_cpu.yaml").ray.object_store_gib is None  # index builds: Ray's default
