"""The engine side of `learner.weight_sync: nccl` (GPU only): vLLM's NCCL weight-transfer engine in every
worker receives DeepSpeed rank 0's broadcast (the trainer side is `actors.learner.nccl_sync`).
`NcclWeightTransfer` is a mixin of `actors.engines.vllm_engine.VLLMEngine` (it uses the engine's
`_engine` (AsyncLLM), `_update_lock`, `_param_names`, `_tied`, `_check_whole_layers`); the request
builders check a message the way vLLM's workers will parse it, before any NCCL call.
"""

from __future__ import annotations

import asyncio
from typing import Any

# `VLLMEngine(..., **NCCL_WEIGHT_TRANSFER)`: give every vLLM worker an NCCL weight-transfer engine
# (vLLM `WeightTransferConfig(backend="nccl")`), which `init_weight_transfer` / `receive_weights` need.
NCCL_WEIGHT_TRANSFER: dict[str, Any] = {"weight_transfer_config": {"backend": "nccl"}}


def _check_as(info_cls: type, payload: Any, what: str, invalid: str) -> None:
    """Parse `payload` the way vLLM's workers will (`info_cls(**payload)`), before any NCCL call.

    Raises:
        ValueError: "<what> must be a dict, got ..." or "<what's method>: <invalid> (<vLLM's message>)".
    """
    if not isinstance(payload, dict):
        raise ValueError(f"{what} must be a dict, got {type(payload).__name__}")
    try:
        info_cls(**payload)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what.split(':')[0]}: {invalid} ({e})") from None


def weight_transfer_init_request(info: dict[str, Any]):
    """vLLM's `WeightTransferInitRequest` for `AsyncLLM.init_weight_transfer_engine`, after checking `info`
    the way the NCCL workers will parse it (`NCCLWeightTransferInitInfo(**info)`: master_address,
    master_port, rank_offset, world_size, packed, ...; built by `actors.learner.nccl_sync.engine_init_infos`).

    Raises:
        ValueError: `info` is not a dict, or not valid NCCL init info (message from vLLM's dataclass).
    """
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo

    _check_as(NCCLWeightTransferInitInfo, info, "init_weight_transfer: info", "not NCCL init info")
    return WeightTransferInitRequest(init_info=dict(info))


def weight_transfer_update_request(update: dict[str, Any]):
    """vLLM's `WeightTransferUpdateRequest` for `AsyncLLM.update_weights`, after checking `update` the way
    the NCCL workers will parse it (`NCCLWeightTransferUpdateInfo(**update)`: names, dtype_names, shapes of
    equal lengths; built by `actors.learner.nccl_sync.update_message`).

    Raises:
        ValueError: `update` is not a dict, misses or adds keys, or its lists differ in length.
    """
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    _check_as(NCCLWeightTransferUpdateInfo, update, "receive_weights: update", "not an NCCL update message")
    return WeightTransferUpdateRequest(update_info=dict(update))


class NcclWeightTransfer:
    """`init_weight_transfer` / `check_weight_update` / `receive_weights` of a `VLLMEngine`."""

    weight_transfer_info: dict[str, Any] | None = None  # the init info of the group this engine is in

    def _check_weight_transfer_configured(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"VLLMEngine.{what} called after shutdown()")
        wt = getattr(self._engine.vllm_config, "weight_transfer_config", None)
        if wt is None or wt.backend != "nccl":
            raise RuntimeError(f"VLLMEngine.{what}: this engine was started without vLLM's NCCL weight transfer "
                               f"(weight_transfer_config={wt!r}); start it with VLLMEngine(..., "
                               "**NCCL_WEIGHT_TRANSFER), or use learner.weight_sync: object_store")

    def check_weight_update(self, update: dict[str, Any]) -> None:
        """Check an NCCL update message before any NCCL call (a rejected update would leave the trainer
        blocked in its broadcast): valid for vLLM (`weight_transfer_update_request`), names of this
        checkpoint (a tied model's `lm_head.weight` is allowed: vLLM's loaders skip it), whole decoder layers.

        Raises:
            ValueError: as `weight_transfer_update_request`, unknown names, or a layer given in part.
        """
        weight_transfer_update_request(update)
        names = list(update["names"])
        if len(set(names)) != len(names):
            raise ValueError("receive_weights: a tensor name is given twice")
        if self._param_names is not None:
            unknown = [n for n in names if n not in self._param_names and not (self._tied and n == "lm_head.weight")]
            if unknown:
                raise ValueError(f"receive_weights: {len(unknown)} names are not in the checkpoint of {self.model}, "
                                 f"e.g. {unknown[:3]}; send Hugging Face parameter names (model.named_parameters())")
        self._check_whole_layers(set(names))

    async def init_weight_transfer(self, info: dict[str, Any]) -> None:
        """Join this engine's workers to the trainer's NCCL weight-transfer group (`AsyncLLM.
        init_weight_transfer_engine` with a vLLM `WeightTransferInitRequest`; `info`: see
        `weight_transfer_init_request`). Blocks until every member joined (the trainer's rank 0 opens the group
        at the same time). A group joined before is left first (`shutdown_weight_transfer_engine`).

        Raises:
            RuntimeError: shut down, or not started with `NCCL_WEIGHT_TRANSFER`.
            ValueError: bad `info`.
        """
        self._check_weight_transfer_configured("init_weight_transfer")
        request = weight_transfer_init_request(info)
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            if self.weight_transfer_info is not None:
                self.weight_transfer_info = None
                await self._engine.shutdown_weight_transfer_engine()
            await self._engine.init_weight_transfer_engine(request)
            self.weight_transfer_info = dict(info)

    async def receive_weights(self, update: dict[str, Any], version: int | None = None) -> None:
        """Receive one NCCL broadcast of weights (metadata `update`: names, dtype_names, shapes, in broadcast
        order) while the trainer sends it, load it in place, reset the prefix cache (running requests
        preempted, as `update_weights`) and set `weight_version = version` (None keeps it).

        vLLM calls: `AsyncLLM.start_weight_update`, `update_weights(WeightTransferUpdateRequest)` (the workers'
        `NCCLWeightTransferEngine` receives the packed broadcast and calls `model.load_weights`),
        `finish_weight_update` (finalizes the layerwise reload, i.e. `process_weights_after_loading`).

        Raises:
            RuntimeError: shut down, not started with `NCCL_WEIGHT_TRANSFER`, not in a group
                (`init_weight_transfer`), or the prefix cache could not be reset.
            ValueError: as `check_weight_update` (raised before any NCCL call).
        """
        self._check_weight_transfer_configured("receive_weights")
        if self.weight_transfer_info is None:
            raise RuntimeError("VLLMEngine.receive_weights: this engine is in no weight-transfer group; call "
                               "init_weight_transfer first")
        self.check_weight_update(update)
        request = weight_transfer_update_request(update)
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            await self._engine.start_weight_update()
            await self._engine.update_weights(request)  # on failure vLLM's worker ends the update itself
            await self._engine.finish_weight_update()
            if not await self._engine.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vLLM could not reset its prefix cache after a weight update")
            if version is not None:
                self.weight_version = int(version)
