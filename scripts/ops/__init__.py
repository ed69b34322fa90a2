"""Operations checks: soaks, chaos runs, the two-node smoke, cluster and GPU checks, manifest validation."""
