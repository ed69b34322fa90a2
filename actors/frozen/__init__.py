"""Frozen LLMs that score episodes: the s3 generator and judge, R-Search's verifier.

- `scorer`: `FrozenLLM` (greedy, cached answers and judgements on an engine), `ThreadScorer`,
  `ActorScorer` (the `recipes.base.Scorer` adapters rewards call).
- `worker`: `FrozenLLMWorker` (the Ray actor) and `start_frozen_llm`.
"""
