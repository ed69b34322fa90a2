"""`scripts.ops.learning_check`, `pipelines.learning_check` and `pipelines.learning_check_table`: the verdict
(pass only when the total reward rose with its paired interval above 0), the per-question table, the config it
trains with (the pool is the fixed questions, every step all of them), the question choice, and the command line;
one tiny end-to-end run (slow)."""

from __future__ import annotations

import json

import pytest

from configs import load_config
from pipelines.learning_check import CheckResult, check_config, pick_questions, question_key, saved_policy
from pipelines.learning_check_table import (
    LearningCheckError, build_table, compare, decide, episode_scores, format_table, learnable_groups, per_question,
)


def traj(gid: str, reward: float, answer: str | None = None, golds=("paris",), components=None, searches: int = 0):
    """A trajectory dict with the fields the check reads."""
    return {"group_id": gid, "reward": reward, "reward_components": components or {},
            "final": {"answer": answer} if answer is not None else {}, "golden_answers": list(golds),
            "turns": [{"query": "q"}] * searches + [{"query": None}]}


def row(set_name: str, diff: float, lo: float, hi: float, metric: str = "reward") -> dict:
    return {"set": set_name, "metric": metric, "before": 0.2, "after": 0.2 + diff, "diff": diff, "lo": lo, "hi": hi,
            "questions": 16}


# -- the verdict -------------------------------------------------------------------------------------------------

def test_passes_only_when_the_total_reward_rose_with_its_interval_above_0():
    assert decide([row("sampled", 0.10, 0.02, 0.18)]).passed
    assert not decide([row("sampled", 0.10, 0.0, 0.18)]).passed  # the interval reaches 0
    assert not decide([row("sampled", 0.10, -0.01, 0.2)]).passed
    assert not decide([row("sampled", 0.0, 0.0, 0.0)]).passed  # nothing moved
    assert not decide([row("sampled", -0.1, -0.2, -0.05)]).passed
    # only the total reward decides: a component's rise does not
    assert not decide([row("sampled", -0.1, -0.2, -0.05), row("sampled", 0.3, 0.1, 0.5, metric="reward/em")]).passed
    verdict = decide([row("sampled", 0.10, 0.02, 0.18)])
    assert "rose" in verdict.reason and "+0.100 [+0.020, +0.180]" in verdict.reason


def test_the_criterion_picks_the_scoring_that_decides():
    table = [row("greedy", 0.0, -0.1, 0.1), row("sampled", 0.1, 0.05, 0.15)]
    assert decide(table, "sampled").passed and not decide(table, "greedy").passed
    assert not decide(table, "both").passed
    assert decide([row("greedy", 0.1, 0.01, 0.2), row("sampled", 0.1, 0.05, 0.15)], "both").passed
    with pytest.raises(LearningCheckError, match="criterion"):
        decide(table, "dev")
    with pytest.raises(LearningCheckError, match="no total reward of the greedy"):
        decide([row("sampled", 0.1, 0.05, 0.15)], "greedy")


# -- the table ---------------------------------------------------------------------------------------------------

def test_episode_scores_read_reward_components_answer_and_searches():
    s = episode_scores(traj("a", 1.5, "Paris", components={"em": 1.0, "found": 0.5}, searches=2))
    assert s == {"reward": 1.5, "reward/em": 1.0, "reward/found": 0.5, "EM": 1.0, "F1": 1.0, "searches": 2.0}
    none = episode_scores({**traj("a", None), "final": {"answer": "  "}})  # no answer, a None reward: 0
    assert none["reward"] == 0.0 and none["EM"] == 0.0 and none["F1"] == 0.0


def test_per_question_means_over_samples_and_missing_components_count_0():
    q = per_question([traj("a", 1.0, components={"em": 1.0}), traj("a", 0.0), traj("b", 0.5, "paris london")])
    assert list(q) == ["a", "b"]
    assert q["a"]["reward"] == 0.5 and q["a"]["reward/em"] == 0.5
    assert q["b"]["F1"] == pytest.approx(2 / 3)
    with pytest.raises(LearningCheckError, match="no trajectories"):
        per_question([])


def test_compare_pairs_questions_and_orders_the_metrics():
    before = [traj(g, 0.0, "london", components={"em": 0.0}) for g in "abcdefgh" for _ in range(2)]
    after = [traj(g, 1.0, "paris", components={"em": 1.0}) for g in "abcdefgh" for _ in range(2)]
    rows = compare(before, after, "sampled")
    assert [r["metric"] for r in rows] == ["reward", "reward/em", "EM", "F1", "searches"]
    total = rows[0]
    assert (total["before"], total["after"], total["diff"], total["lo"], total["hi"]) == (0.0, 1.0, 1.0, 1.0, 1.0)
    assert total["questions"] == 8 and decide(rows).passed
    same = compare(before, before, "sampled")
    assert all(r["diff"] == 0.0 and r["lo"] == 0.0 for r in same) and not decide(same).passed
    with pytest.raises(LearningCheckError, match="different questions"):
        compare(before, [traj("z", 1.0)], "sampled")


def test_a_noisy_rise_fails_and_a_steady_one_passes():
    """Per-question differences that straddle 0 give an interval reaching below 0 (fail); the same mean rise on
    every question passes."""
    gids = [f"q{i}" for i in range(16)]
    before = [traj(g, 0.5) for g in gids]
    noisy = [traj(g, 0.5 + (0.9 if i % 2 else -0.7)) for i, g in enumerate(gids)]
    steady = [traj(g, 0.6) for g in gids]
    assert not decide(compare(before, noisy, "sampled")).passed
    assert decide(compare(before, steady, "sampled")).passed


def test_build_table_keeps_the_scoring_order_and_formats_every_row():
    sets = {"dev": [traj("d", 0.0)], "sampled": [traj("a", 0.0)], "greedy": [traj("a", 0.0)]}
    table = build_table(sets, {k: [{**t, "reward": 1.0} for t in v] for k, v in sets.items()})
    assert [r["set"] for r in table if r["metric"] == "reward"] == ["greedy", "sampled", "dev"]
    text = format_table(table)
    assert "| training questions, greedy | reward (total) | 0.000 | 1.000 | +1.000 [+1.000, +1.000] | 1 |" in text
    assert "| dev, greedy | F1 |" in text and len(text.splitlines()) == 2 + len(table)
    with pytest.raises(LearningCheckError, match="scorings differ"):
        build_table(sets, {"greedy": sets["greedy"]})


# -- the config and the questions --------------------------------------------------------------------------------

def test_the_check_trains_every_step_on_exactly_the_fixed_questions():
    cfg = check_config(load_config("configs/search_r1_expert_em_cpu.yaml"), questions=16, steps=3)
    t = cfg.train
    assert (t.questions_per_step, t.total_steps, t.select_questions, t.eval_questions) == (16, 3, 0, 0)
    assert t.async_mode == "off"
    assert t.wandb.mode == "disabled" and t.warm_start is not None and t.warm_start.source == "expert"  # kept
    assert cfg.algorithm == load_config("configs/search_r1_expert_em_cpu.yaml").algorithm  # the recipe's own
    from pipelines.step_schedule import batch_indices

    for step in range(3):  # a step's questions are a permutation of the whole pool when the pool is the set
        assert sorted(batch_indices(step, t.questions_per_step, 16, cfg.seed, t.shuffle)) == list(range(16))


def test_the_trainer_draws_from_the_fixed_questions_and_keeps_the_first_rollout(tmp_path):
    from pipelines.learning_check import _fixed_pool_trainer

    cfg = check_config(load_config("configs/search_r1_expert_em_cpu.yaml", [f"run_dir={tmp_path}"]), 4, 2)
    fixed = [{"id": f"q{i}", "question": f"question {i}", "golden_answers": ["a"], "dataset": "nq", "meta": {}}
             for i in range(4)]
    trainer = _fixed_pool_trainer(cfg, tmp_path, fixed, progress=False)
    calls = []

    def rollout(examples, options, n, temperature, seed):
        calls.append((examples, n, temperature, seed))
        return [{"seed": seed}]

    trainer.rollout = rollout
    assert trainer.training_questions(cfg.data.train, {}) == fixed
    first = trainer.step_rollout(0)
    trainer.step_rollout(1)
    assert trainer.first_rollout is first
    for examples, n, temperature, _ in calls:
        assert sorted(e["id"] for e in examples) == ["q0", "q1", "q2", "q3"]
        assert (n, temperature) == (cfg.rollout.samples_per_prompt, cfg.rollout.temperature)
    assert calls[0][3] == cfg.seed * 1_000_003  # the seed the 'after' sampled scoring repeats


def test_a_staged_config_is_checked_one_stage_at_a_time():
    r1 = load_config("configs/r1_searcher_cpu.yaml")
    with pytest.raises(LearningCheckError, match="--stage 1 ... --stage 2"):
        check_config(r1, 16, 2)
    with pytest.raises(LearningCheckError, match="stages 1 to 2"):
        check_config(r1, 16, 2, stage=3)
    two = check_config(r1, 16, 4, stage=2)
    assert len(two.train.stages) == 1 and two.train.stages[0].steps == 4
    assert two.train.stages[0].recipe_options == {"stage": 2}
    from pipelines.step_schedule import stage_at, total_steps

    assert total_steps(two) == 4 and stage_at(two, 3)[1]["stage"] == 2
    with pytest.raises(LearningCheckError, match="has no stages"):
        check_config(load_config("configs/s3_cpu.yaml"), 16, 2, stage=1)


@pytest.mark.parametrize("questions, steps, match", [(1, 2, "at least 2 questions"),
                                                     (16, 0, "at least 1 training step")])
def test_bad_counts_are_refused(questions, steps, match):
    with pytest.raises(LearningCheckError, match=match):
        check_config(load_config("configs/s3_cpu.yaml"), questions, steps)


def test_a_set_that_does_not_fill_the_mini_batches_is_refused_before_ray():
    # 16 questions x 8 samples fills mini-batches of 32; 3 x 8 = 24 does not: validate() names it, before Ray
    from pipelines.train import TrainConfigError, validate

    cfg = check_config(load_config("configs/search_r1_expert_em_cpu.yaml"), 3, 1)
    with pytest.raises(TrainConfigError, match="mini_batch_size"):
        validate(cfg, need_index=False)


def test_start_from_a_saved_policy_skips_the_warm_start(tmp_path):
    hf = tmp_path / "run" / "checkpoints" / "warm-start" / "policy" / "hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    assert saved_policy(tmp_path / "run") == hf.resolve() and saved_policy(hf) == hf.resolve()
    cfg = check_config(load_config("configs/search_r1_expert_em_cpu.yaml"), 16, 2, start_from=tmp_path / "run")
    assert cfg.learner.model == str(hf.resolve()) and cfg.train.warm_start is None
    with pytest.raises(LearningCheckError, match="no model there"):
        saved_policy(tmp_path)


def test_the_fixed_questions_leave_out_the_warm_start_s_and_spread_over_datasets():
    pool = [{"id": f"{d}{i}", "dataset": d, "question": "?", "golden_answers": ["a"]} for d in "xyz" for i in range(10)]
    warm = pool[:10]  # every x question
    picked = pick_questions(pool, 6, seed=0, exclude=warm)
    assert len(picked) == 6 and not {p["id"] for p in picked} & {w["id"] for w in warm}
    assert sorted(p["dataset"] for p in picked) == ["y"] * 3 + ["z"] * 3
    assert pick_questions(pool, 6, seed=0, exclude=warm) == picked  # fixed: the same set every time
    with pytest.raises(LearningCheckError, match="only 20 training questions are left"):
        pick_questions(pool, 21, seed=0, exclude=warm)


# -- the command line --------------------------------------------------------------------------------------------

def _result(passed: bool) -> CheckResult:
    table = [row("sampled", 0.1 if passed else 0.0, 0.05 if passed else -0.05, 0.15)]
    return CheckResult(config="c.yaml", recipe="search_r1", stage=None, algorithm="grpo", start="the base model",
                       steps=2, samples=8, temperature=0.8, criterion="sampled", questions=["nq/1"],
                       selection="1 training question spread over the datasets", table=table,
                       passed=passed, reason=decide(table).reason, run_dir="runs/x", minutes={"total": 1.0})


@pytest.mark.parametrize("passed, status", [(True, 0), (False, 1)])
def test_exit_status_is_0_only_when_the_reward_rose(monkeypatch, capsys, tmp_path, passed, status):
    import pipelines.learning_check as lc
    from scripts.ops import learning_check

    seen = {}
    monkeypatch.setattr(lc, "run_learning_check", lambda cfg, **kw: seen.update(cfg=cfg, **kw) or _result(passed))
    out = tmp_path / "r.json"
    with pytest.raises(SystemExit) as e:
        learning_check.main(["--config", "configs/search_r1_expert_em_cpu.yaml", "--questions", "16", "--steps", "3",
                             "--out", str(out), "train.questions_per_step=4"])
    assert e.value.code == status
    assert seen["cfg"].train.questions_per_step == 16 and seen["cfg"].train.total_steps == 3  # the options win
    text = capsys.readouterr().out
    assert "| training questions, sampled | reward (total) |" in text
    assert ("PASSED: " if passed else "FAILED: ") in text
    assert json.loads(out.read_text())["passed"] is passed


@pytest.mark.parametrize("argv, match", [
    (["--config", "configs/r1_searcher_cpu.yaml"], "check one at a time"),
    (["--config", "configs/s3_cpu.yaml", "--questions", "1"], "at least 2 questions"),
    (["--config", "configs/s3_cpu.yaml", "train.no_such_key=1"], "no_such_key"),
    (["--config", "configs/search_r1_expert_em_cpu.yaml", "--questions", "3"], "mini_batch_size"),
    (["--config", "configs/s3_cpu.yaml", "--dev-questions", "-1"], "dev-questions"),
])
def test_bad_input_is_one_error_line_and_status_2(monkeypatch, capsys, argv, match):
    import cluster.ray_init
    from scripts.ops import learning_check

    monkeypatch.setattr(cluster.ray_init, "init_ray", lambda *a, **k: pytest.fail("Ray must not start"))
    with pytest.raises(SystemExit) as e:
        learning_check.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and match in err and "Traceback" not in err


# -- the run, on a scripted trainer (no Ray) -----------------------------------------------------------------------

class ScriptedTrainer:
    """Stands in for `_fixed_pool_trainer`'s Trainer: each question's reward is 0.2 before any update and 0.2 +
    `gain` after (plus a per-question spread), so the check's table and verdict are known; the samples of the
    questions at even positions of a rollout's list differ by 0.1 each (their mean shifts alike before and after);
    `stop_at` raises the stop signal's exception in that step, as `GracefulStop` does."""

    def __init__(self, fixed, gain: float, stop_at: int | None = None):
        self.fixed, self.gain, self.stop_at = fixed, gain, stop_at
        self.version, self.first_rollout, self.closed, self.searches = 0, None, False, True
        self.on_phase = lambda name: None

    def start(self):
        pass

    def rollout(self, examples, options, n, temperature, seed):
        out = []
        for i, e in enumerate(examples):
            reward = 0.2 + 0.01 * i + (self.gain if self.version else 0.0)
            rewards = [reward + (0.1 * j if i % 2 == 0 else 0.0) for j in range(n)]
            out += [{**traj(question_key(e), r, "x", components={"f1": r}), "weight_version": self.version}
                    for r in rewards]
        return out

    def step(self, step):
        import signal

        from pipelines.graceful_stop import StopRequested

        self.on_phase("rollout+score")
        trajs = self.rollout(self.fixed, {}, 4, 1.0, seed=step)
        if step == 0:
            self.first_rollout = trajs
        if step == self.stop_at:
            raise StopRequested(signal.SIGTERM, clean=True)
        self.version += 1
        return {"rollout/reward_mean": 0.0}

    def close(self, timeout_s):
        self.closed = True


@pytest.fixture
def scripted(monkeypatch):
    """Run `run_learning_check` on a `ScriptedTrainer` with Ray, the index and the cluster check stubbed out."""
    import cluster.ray_init
    import cluster.roles
    import pipelines.build_index
    import pipelines.learning_check as lc

    made = {}
    monkeypatch.setattr(cluster.ray_init, "init_ray", lambda ray_cfg: False)
    monkeypatch.setattr(pipelines.build_index, "ensure_index", lambda cfg, progress=True: None)
    monkeypatch.setattr(cluster.roles, "check_ray_cluster", lambda cfg: None)

    def run(tmp_path, gain: float, stop_at: int | None = None, questions: int = 4, **kw):
        def make(cfg, run_dir, fixed, progress):
            made["candidates"], made["trainer"] = list(fixed), ScriptedTrainer(fixed, gain, stop_at)
            return made["trainer"]

        monkeypatch.setattr(lc, "_fixed_pool_trainer", make)
        cfg = check_config(load_config("configs/r_search_cpu.yaml", [f"run_dir={tmp_path}"]), questions, 2)
        return lc.run_learning_check(cfg, config_name="configs/r_search_cpu.yaml", dev_questions=3, resamples=200, **kw)

    run.made = made
    return run


@pytest.mark.parametrize("gain, passed", [(0.3, True), (0.0, False)])
def test_a_check_scores_before_and_after_and_writes_its_result(scripted, tmp_path, gain, passed):
    from pipelines.learning_check import RESULT_DIR

    result = scripted(tmp_path, gain)
    assert result.passed is passed and scripted.made["trainer"].closed
    total = {r["set"]: r for r in result.table if r["metric"] == "reward"}
    assert set(total) == {"greedy", "sampled", "dev"}
    assert total["sampled"]["diff"] == pytest.approx(gain) and total["greedy"]["diff"] == pytest.approx(gain)
    assert total["sampled"]["questions"] == 4 and total["dev"]["questions"] == 3
    assert result.start.startswith("the base model") and set(result.minutes) >= {"start", "before", "training",
                                                                                   "after", "total"}
    out = next(tmp_path.glob(f"learning-check-r_search-*/{RESULT_DIR}"))
    assert json.loads((out / "result.json").read_text())["passed"] is passed
    assert len(list(out.glob("*.jsonl.gz"))) == 6


def test_candidates_choose_the_questions_whose_rewards_differ(scripted, tmp_path):
    """`candidates`: the starting policy's samples of 8 spread candidates; the 4 whose rewards differ (the scripted
    trainer's even positions) are the fixed set, in the candidates' order, and train and score."""
    from pipelines.learning_check import RESULT_DIR

    result = scripted(tmp_path, 0.3, candidates=8)
    cand = scripted.made["candidates"]
    assert result.questions == [question_key(q) for q in cand[::2]] and scripted.made["trainer"].fixed == cand[::2]
    assert "of 8 spread candidates" in result.selection and "(4 did)" in result.selection
    assert result.passed and "selection" in result.minutes
    out = next(tmp_path.glob(f"learning-check-r_search-*/{RESULT_DIR}"))
    assert (out / "select-candidates.jsonl.gz").is_file()


@pytest.mark.parametrize("candidates, match", [(5, "only 3 had samples"), (3, "needs at least --questions 4")])
def test_too_few_learnable_candidates_is_a_clear_error(scripted, tmp_path, candidates, match):
    with pytest.raises(LearningCheckError, match=match):
        scripted(tmp_path, 0.3, candidates=candidates)


def test_learnable_groups_are_those_whose_rewards_differ():
    trajs = [traj("a", 1.0), traj("a", 0.0), traj("b", 0.5), traj("b", 0.5 + 1e-9), traj("c", 0.2)]
    assert learnable_groups(trajs) == ["a"]


def test_a_stop_signal_stops_the_check_and_its_actors(scripted, tmp_path):
    """SIGTERM (here: the `StopRequested` the handler raises) in step 2: `TrainingStopped` with status 128 + 15, the
    trainer closed, and the scorings done so far kept."""
    from pipelines.graceful_stop import TrainingStopped
    from pipelines.learning_check import RESULT_DIR

    with pytest.raises(TrainingStopped) as e:
        scripted(tmp_path, 0.3, stop_at=1)
    assert e.value.exit_status == 143 and e.value.completed_steps == 1 and e.value.checkpoint is None
    assert scripted.made["trainer"].closed
    out = next(tmp_path.glob(f"learning-check-r_search-*/{RESULT_DIR}"))
    assert {p.name for p in out.glob("*.jsonl.gz")} == {"before-greedy.jsonl.gz", "before-dev.jsonl.gz",
                                                        "before-sampled.jsonl.gz"}


# -- end to end ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_tiny_check_runs_end_to_end(ray_local, small_index, tiny_gemma_dir, tmp_path):
    """The whole path on the tiny random Gemma: warm start off, 2 questions x 2 samples, 1 GRPO step; every scoring
    holds the fixed questions before and after, the trajectories and result.json are written."""
    from pipelines.learning_check import RESULT_DIR, run_learning_check

    cfg = load_config("configs/r_search_cpu.yaml", [
        f"index.dir={small_index}", "index.num_shards=2", f"run_dir={tmp_path}", f"learner.model={tiny_gemma_dir}",
        f"frozen.model={tiny_gemma_dir}", "rollout.backend=hf", "frozen.backend=hf", "rollout.samples_per_prompt=2",
        "learner.mini_batch_size=4", "learner.micro_batch_size=2", "rollout.max_new_tokens_per_turn=16",
        "rollout.max_total_tokens=1024", "rollout.cpus_per_worker=0.25", "frozen.num_cpus=0.25",
        "learner.cpus_per_rank=0.5", "algorithm.kl_coef=0.0"])
    cfg = check_config(cfg, questions=2, steps=1)
    result = run_learning_check(cfg, config_name="configs/r_search_cpu.yaml", dev_questions=2, resamples=200)
    assert result.start.startswith("the base model") and len(result.questions) == 2
    sets = {r["set"] for r in result.table}
    assert sets == {"greedy", "sampled", "dev"}
    assert {r["metric"] for r in result.table} >= {"reward", "reward/answer_f1", "EM", "F1"}
    assert all(r["questions"] == 2 for r in result.table if r["set"] != "dev")
    assert result.passed == decide(result.table).passed and len(result.step_metrics) == 1
    out = tmp_path.glob(f"learning-check-r_search-*/{RESULT_DIR}")
    out = next(out)
    assert json.loads((out / "result.json").read_text())["questions"] == result.questions
    assert {p.name for p in out.glob("*.jsonl.gz")} == {f"{w}-{s}.jsonl.gz" for w in ("before", "after")
                                                        for s in ("greedy", "sampled", "dev")}


# -- the real checks (heavy tier) -----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.timeout(1900)  # ~10 min on an AMX Xeon's 2 cores (2026-12-08), plus the dense index's first build
def test_r1_searcher_stage_1_raises_its_own_reward(tmp_path):
    """R1-Searcher's stage 1 on Gemma 3 270M base: 2 GRPO steps on the first 4 of 16 candidates whose samples'
    rewards differ raise its reward (retrieval + format) with the paired interval above 0 (measured 0.125 -> 0.328,
    +0.203 [0.016, 0.406]; docs/findings.md)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_SERVICE")}
    out = tmp_path / "result.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.ops.learning_check", "--config", "configs/r1_searcher_cpu.yaml", "--stage", "1",
         "--questions", "4", "--candidates", "16", "--steps", "2", "--dev-questions", "0", "--no-progress",
         "--out", str(out), f"run_dir={tmp_path / 'runs'}"],
        cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    except BaseException:  # SIGTERM lets the check stop its Ray cluster and engines
        proc.terminate()
        proc.communicate(timeout=300)
        raise
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    total = next(r for r in json.loads(out.read_text())["table"] if r["set"] == "sampled" and r["metric"] == "reward")
    assert total["diff"] > 0 and total["lo"] > 0
