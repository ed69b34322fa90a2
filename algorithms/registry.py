"""Name -> function registries behind the string settings of :class:`algorithms.config.AlgorithmConfig`.

Each registry maps a config string to a function with one uniform signature, so the dispatchers
(:func:`algorithms.estimators.compute_advantages`, :func:`algorithms.losses.aggregate`,
:func:`algorithms.kl.kl_estimate`) look the function up instead of branching on the name:

* ``ADVANTAGE_ESTIMATORS`` (``advantage_estimator``): :class:`AdvantageEstimatorFn`,
  ``fn(cfg, seq_rewards, loss_mask, *, group_ids, values, logprobs, ref_logprobs) -> (advantages,
  returns)``: ``[B]`` rewards and ``[B, T]`` tensors in, two ``[B, T]`` tensors out, 0 at masked
  positions and not whitened (shapes and conventions: :mod:`algorithms.estimators`).
* ``LOSS_AGGS`` (``loss_agg``): ``fn(loss_tokens, mask, norm_len, divisor) -> scalar``.
  ``loss_tokens`` ``[B, T]`` is fp32/fp64 and ``mask`` ``[B, T]`` bool; garbage at mask-0
  positions must not be read (use :func:`algorithms.masked.masked_sum` / ``torch.where``).
* ``KL_ESTIMATORS`` (``kl_estimator``): ``fn(log_ratio) -> kl``, both ``[B, T]`` fp32/fp64,
  ``log_ratio = logprobs - ref_logprobs`` (0 at masked positions when a mask is given).

Adding one, e.g. an advantage estimator ``"my_est"``:

1. Decorate a function with the uniform signature, in a module imported before training starts::

       @register_advantage_estimator("my_est")
       def my_est(cfg, seq_rewards, loss_mask, *, group_ids, values, logprobs, ref_logprobs):
           ...
           return advantages, returns

2. Add ``"my_est"`` to the ``AdvantageEstimator`` ``Literal`` in ``algorithms/config.py`` (else
   ``AlgorithmConfig`` rejects the string); ``tests/test_algorithms.py`` checks that registry
   keys and ``Literal`` values agree.  Add it to ``_WHITENED_BY_DEFAULT`` there too if its
   advantages should be whitened unless ``whiten_advantages`` says otherwise.

Likewise ``register_loss_agg`` + ``LossAgg`` and ``register_kl_estimator`` + ``KLEstimator``.
The built-in entries are registered when :mod:`algorithms` is imported
(:mod:`algorithms.estimators`, :mod:`algorithms.losses`, :mod:`algorithms.kl`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from torch import Tensor

GroupIds = Sequence[Hashable] | Tensor
"""Which prompt (GRPO group) each row of a batch answers: one hashable per row, or a `[B]` tensor."""

if TYPE_CHECKING:
    from .config import AlgorithmConfig


class AdvantageEstimatorFn(Protocol):
    """Uniform signature of a registered advantage estimator (see the module docstring)."""

    def __call__(
        self,
        cfg: AlgorithmConfig,
        seq_rewards: Tensor,
        loss_mask: Tensor,
        *,
        group_ids: GroupIds | None,
        values: Tensor | None,
        logprobs: Tensor | None,
        ref_logprobs: Tensor | None,
    ) -> tuple[Tensor, Tensor]: ...


LossAggFn = Callable[[Tensor, Tensor, float | None, float | Tensor | None], Tensor]
KLEstimatorFn = Callable[[Tensor], Tensor]
F = TypeVar("F", bound=Callable)



class Registry(dict[str, F]):
    """A name -> function registry of one `AlgorithmConfig` setting (`setting`, e.g. "loss_agg")."""

    def __init__(self, setting: str):
        super().__init__()
        self.setting = setting

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator putting a function into the registry under `name`.

        Raises:
            ValueError: another function is already registered under `name`.
        """

        def decorator(fn: F) -> F:
            previous = super(Registry, self).get(name)
            if previous is not None and previous is not fn:
                raise ValueError(f"`{self.setting}` {name!r} is already registered "
                                 f"({previous.__module__}.{previous.__qualname__}); choose another name")
            self[name] = fn
            return fn

        return decorator

    def lookup(self, name: str) -> F:
        """The function registered as `name`.

        Raises:
            ValueError: `name` is not registered; the message lists the registered names.
        """
        if name not in self:
            raise ValueError(f"unknown `{self.setting}` {name!r}; registered: {', '.join(sorted(self))}")
        return self[name]


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimatorFn] = Registry("advantage_estimator")
LOSS_AGGS: Registry[LossAggFn] = Registry("loss_agg")
KL_ESTIMATORS: Registry[KLEstimatorFn] = Registry("kl_estimator")

register_advantage_estimator = ADVANTAGE_ESTIMATORS.register
"""Decorator: `@register_advantage_estimator(name)` puts an `AdvantageEstimatorFn` into `ADVANTAGE_ESTIMATORS`."""
get_advantage_estimator = ADVANTAGE_ESTIMATORS.lookup
"""The advantage estimator registered under a name (ValueError naming the registered ones otherwise)."""
register_loss_agg = LOSS_AGGS.register
"""Decorator: `@register_loss_agg(name)` puts a `fn(loss_tokens, mask, norm_len, divisor)` into `LOSS_AGGS`."""
get_loss_agg = LOSS_AGGS.lookup
"""The loss aggregation registered under a name (ValueError naming the registered ones otherwise)."""
register_kl_estimator = KL_ESTIMATORS.register
"""Decorator: `@register_kl_estimator(name)` puts a `fn(log_ratio) -> kl` into `KL_ESTIMATORS`."""
get_kl_estimator = KL_ESTIMATORS.lookup
"""The KL estimator registered under a name (ValueError naming the registered ones otherwise)."""
