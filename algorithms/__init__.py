"""Pure torch RL math: advantage estimators and losses. Filled in by the RL algorithms issue."""
