"""Probes and demos: base rates of the data pack's questions, the learnable-question selection, one rollout or search shown."""
