"""Ray actors, by subsystem. Each actor is a thin remote shell over a plain Python class that tests
can use without Ray; `actors.lifecycle.ActorSet` starts, readies and stops them.

- `actors.retrieval`: shards, the pool, encoders, the index store, the HTTP route.
- `actors.engines`: the engine protocol, vLLM and transformers backends, `EngineSpec`.
- `actors.rollout`: rollout and evaluation workers, the agent loop, trajectory records.
- `actors.frozen`: the frozen generator / judge / verifier and the scorers rewards call.
- `actors.learner`: DeepSpeed learner ranks, the learner group, train batches, shm cleanup.
"""
