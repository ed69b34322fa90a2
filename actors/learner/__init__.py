"""Learners on DeepSpeed and what they train on.

- `rank`: `DeepSpeedRank`, the shared base of a learner rank (distributed setup, engine, checkpoints).
- `policy`: `PolicyLearner`; `critic`: `CriticLearner`; `reference`: `ReferenceModel`.
- `group`: `LearnerGroup` (R ranks in one placement group and process group; weight sync).
- `batch`: `TrainBatch`, `make_train_batch` (trajectories → padded tensors).
- `token_stats`: `PolicyTokenStats`, `ValueModel` (chunked masked log-probs, values).
- `nccl_sync`: weight sync over NCCL from rank 0 to the vLLM engines (`learner.weight_sync: nccl`, GPU).
- `flops`: model FLOPs of an update and the machine's matmul peak (MFU).
"""
