"""Rollouts: episodes of a recipe on a policy engine against the retrieval pool.

- `worker`: `RolloutWorker` (the Ray actor) and `start_rollout_workers`.
- `eval_worker`: `EvalWorker` (final outputs for evaluation).
- `agent_loop`: `AgentLoop`, `RolloutLimits`, `pool_searcher` (one coroutine per episode).
- `trajectory`: `Trajectory`, `TurnRecord` (token ids, loss mask, log-probs, turns, reward).
"""
