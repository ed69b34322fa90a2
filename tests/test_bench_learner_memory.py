"""`scripts.bench.learner_memory`: its workloads, batches and summary line (the benchmark itself is not run in CI)."""

from __future__ import annotations

import itertools

import pytest

from actors.learner.batch import make_train_batch
from scripts.bench.learner_memory import batch_lengths, line, summarize, trajectories


def test_varied_lengths_change_every_update_and_fixed_ones_repeat():
    varied = list(itertools.islice(batch_lengths("varied", 8), 20))
    assert len({tuple(b) for b in varied}) == 20 and all(len(b) == 8 for b in varied)
    assert all(300 <= p <= 1400 and 4 <= r <= 24 for b in varied for p, r in b)
    assert varied == list(itertools.islice(batch_lengths("varied", 8), 20))  # seeded
    fixed = list(itertools.islice(batch_lengths("fixed", 8), 3))
    assert fixed[0] == fixed[1] == fixed[2]


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="--workload"):
        next(batch_lengths("mixed", 8))


def test_trajectories_have_the_asked_lengths_and_pad_into_a_batch():
    lengths = [(300, 4), (1400, 24), (700, 9), (512, 16)]
    rows = trajectories(lengths, list(range(5000)), update=3)
    assert [(len(t["prompt_ids"]), len(t["response_ids"])) for t in rows] == lengths
    assert all(t["loss_mask"] == [1] * len(t["response_ids"]) for t in rows)
    batch = make_train_batch(rows, pad_token_id=0)
    assert batch.size == 4 and batch.prompt_len == 1400 and batch.response_len == 24
    assert int(batch.attention_mask.sum()) == sum(p + r for p, r in lengths)


def test_summary_counts_growth_from_update_2_and_per_token_time():
    rows = [{"rss_mb": 3000.0 + 100 * i, "update_s": 10.0, "sequence_tokens": 5000.0 if i < 6 else 4000.0}
            for i in range(12)]
    s = summarize(rows, "varied", "0")
    assert s["rank_rss_first_mb"] == 3100 and s["growth_mb"] == pytest.approx(1000.0)
    assert s["ms_per_token_first"] == pytest.approx(2.0) and s["ms_per_token_last"] == pytest.approx(2.5)
    assert line(s) == ("learner_memory: workload=varied onednn_cache=0 updates=12 ms_per_token_first=2.00 "
                       "ms_per_token_last=2.50 rank_rss_first_mb=3100 rank_rss_last_mb=4100 growth_mb=1000")
