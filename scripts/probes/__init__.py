"""Probes and demos: base rates of the data pack's questions, the learnable-question selection, the expert's ceiling, an s3 run's rollouts step by step, one rollout or search shown."""
