"""The peer framework's runners for the side-by-side (TRL's GRPOTrainer on the same data and reward)."""
