"""scripts.bench.peer's bookkeeping: the prompts TRL gets (the run's own, in step order), the summaries and the line's parts."""

from __future__ import annotations

import gzip
import json

import pytest

from scripts.bench.peer import first_last, median_from_step2, ours_summary, spread, trl_rows


def _write_rollouts(run_dir, tokenizer, steps):
    (run_dir / "rollouts").mkdir(parents=True)
    for step, questions in enumerate(steps, start=1):
        with gzip.open(run_dir / "rollouts" / f"step-{step}.jsonl.gz", "wt") as f:
            for q in questions:
                ids = tokenizer(f"Question: {q}\nAnswer:")["input_ids"]
                for sample in range(2):  # a group's samples share the prompt
                    f.write(json.dumps({"group_id": f"d/{q}", "sample_index": sample, "prompt_ids": ids,
                                        "question": q, "golden_answers": [q.upper()]}) + "\n")


def test_trl_gets_each_question_once_in_step_order(tmp_path, gemma_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    _write_rollouts(tmp_path, tok, [["b", "a"], ["c", "d"]])
    rows = trl_rows(tmp_path, 2, gemma_dir)
    assert [r["prompt"] for r in rows] == [f"Question: {q}\nAnswer:" for q in "bacd"]  # BOS dropped: TRL adds it
    assert rows[0]["golden_answers"] == ["B"] and rows[0]["question"] == "b"


def test_summaries():
    assert first_last([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == "0.200->0.500"
    assert median_from_step2([100.0, 10.0, 12.0, 11.0]) == 11.0  # step 1's warm-up left out
    assert median_from_step2([7.0]) == 7.0
    assert spread([0.1, 0.3]) == pytest.approx(0.1) and spread([0.2]) == 0.0


def test_ours_summary_reads_training_rows(tmp_path):
    rows = [{"step": 0, "dev/answer_f1": 0.1}]
    for s in range(1, 4):
        rows.append({"step": s, "rollout/reward_mean": 0.1 * s, "rollout/policy_tokens": 10.0, "rollout/episodes": 16.0,
                     "time/step_s": 50.0 + s, "time/rollout_s": 5.0, "time/prepare_s": 0.0, "time/update_s": 40.0,
                     "time/sync_s": 5.0 + s})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = ours_summary(tmp_path)
    assert out["reward"] == pytest.approx([0.1, 0.2, 0.3]) and out["tokens"] == [160.0] * 3
    assert out["phases"]["sync_s"] == pytest.approx(7.5) and out["step_s"] == [51.0, 52.0, 53.0]
