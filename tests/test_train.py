"""The training pipeline: data order, stages, config checks, tracking, and a real two-step run on the
local Ray cluster (tiny Gemma 3 policy and frozen LLM on the transformers backend, the real
retrieval pool over the pack) that checkpoints, resumes with the same data order, and plots."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch

from configs import load_config
from pipelines.train import TrainConfigError, batch_indices, stage_at, total_steps, validate


def cfg_with(*overrides: str, config: str = "configs/r1_searcher_cpu.yaml"):
    """A shipped config; `index.dir` points at an existing folder (a clean checkout has no index),
    so only the rule a test aims at fails (later overrides win)."""
    existing = str(Path(__file__).parent)
    return load_config(config, [f"index.dir={existing}", *overrides])


def test_batch_order_is_a_function_of_the_step():
    steps = [batch_indices(s, 3, 7, seed=1, shuffle=True) for s in range(7)]
    first_epoch = [i for s in steps[:7] for i in s][:7]
    assert sorted(first_epoch) == list(range(7))  # every question once per epoch
    assert steps[4] == batch_indices(4, 3, 7, seed=1, shuffle=True)  # resumable: same step, same questions
    assert batch_indices(0, 3, 7, seed=2, shuffle=True) != steps[0] or batch_indices(1, 3, 7, 2, True) != steps[1]
    assert batch_indices(2, 3, 7, seed=1, shuffle=False) == [6, 0, 1]  # wraps into the next epoch


def test_stages_schedule_recipe_options():
    cfg = cfg_with()
    assert total_steps(cfg) == 20
    assert stage_at(cfg, 0)[:2] == (0, {"max_turns": 2, "worked_example": True, "prefill": "<|begin_of_query|>",
                                        "topk": 3, "stage": 1})
    assert stage_at(cfg, 9)[1]["stage"] == 1 and stage_at(cfg, 10)[1]["stage"] == 2
    assert total_steps(cfg_with("train.total_steps=7", config="configs/s3_cpu.yaml")) == 7  # no stages


@pytest.mark.parametrize("config, overrides, match", [
    ("configs/train_cpu.yaml", ["train.recipe=direct"], "evaluation baseline"),
    ("configs/r1_searcher_cpu.yaml", ["train.questions_per_step=3"], "learner.mini_batch_size"),
    ("configs/r1_searcher_cpu.yaml", ["rollout.samples_per_prompt=1", "learner.mini_batch_size=2"],
     "samples_per_prompt >= 2"),
    ("configs/r1_searcher_cpu.yaml", ["index.dir=/nonexistent/index"], "index.dir"),
])
def test_bad_training_configs_fail_before_any_actor(config, overrides, match):
    with pytest.raises(TrainConfigError, match=match):
        validate(cfg_with(*overrides, config=config))


@pytest.mark.parametrize("overrides, match", [
    (["train.recipe_options.max_turns=-1"], "train.recipe_options: recipe 's3': max_turns: Input should be greater"),
    (["train.recipe_options.max_turn=2"], r"max_turn: Extra inputs are not permitted \(its options: max_turns,"),
    (["train.recipe_options.topk=5"], "topk: top-k is set once, by retrieval.topk"),
    (["train.recipe=nope"], "train.recipe: unknown recipe 'nope'"),
    (["train.stages=[{steps: 1, recipe_options: {stage: 3}}]"], "train.stages: stage 0: recipe 's3': stage"),
])
def test_recipe_options_are_checked_when_the_config_loads(overrides, match):
    from configs import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config("configs/s3_cpu.yaml", overrides)


def test_one_topk_for_retrieval_and_recipe():
    cfg = cfg_with("retrieval.topk=5")
    assert stage_at(cfg, 0)[1]["topk"] == 5
    assert cfg.recipe_config({"stage": 2}) == {"max_turns": 2, "worked_example": True, "prefill": "<|begin_of_query|>",
                                               "stage": 2, "topk": 5}


def test_tracker_writes_jsonl_and_plots(tmp_path):
    from pipelines.tracking import Tracker, read_metrics

    cfg = cfg_with("train.wandb.mode=disabled")
    tr = Tracker(tmp_path, cfg)
    for step in (1, 2, 3):
        tr.log({"rollout/reward_mean": 0.1 * step, "rollout/reward_std": 0.05, "rollout/reward/format": 0.5,
                **({"dev/reward_mean": 0.2} if step == 3 else {})}, step=step)
    tr.log({"rollout/reward_mean": 0.9}, step=3)  # a resumed run repeats step 3: the later row wins
    png = tr.finish()
    assert png is not None and png.stat().st_size > 10_000
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["rollout/reward_mean"] == 0.9


def test_a_resumed_tracker_drops_the_rows_after_its_checkpoint(tmp_path):
    """The stopped run logged steps 1-5 (the last half-written by a kill), its checkpoint was step 3: the
    resumed run keeps 0-3 and redoes 4-5; a new run in the same directory starts the file afresh."""
    from pipelines.tracking import Tracker, read_metrics

    cfg = cfg_with("train.wandb.mode=disabled")
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "rollout/reward_mean": 0.1}) + "\n" for s in range(5))
                    + '{"step": 5, "rollout/rew')
    tr = Tracker(tmp_path, cfg, resumed_at=3)
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2, 3]
    tr.log({"rollout/reward_mean": 0.7}, step=4)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2, 3, 4]
    Tracker(tmp_path, cfg)
    assert not path.exists()


def _tiny_run(config: str, small_index, tiny_gemma_dir, run_dir, *overrides: str):
    """A shipped recipe config shrunk to a CI-sized run: tiny Gemma policy and frozen LLM on the
    transformers backend, the real pool over the test index, 2 questions x 2 samples, 16-token turns.
    A random policy earns no reward, so group advantages are 0; the entropy bonus gives every update a
    gradient, so the weights must move (weight decay alone moves them ~1e-6)."""
    return cfg_with(
        f"index.dir={small_index}", "index.num_shards=2", f"run_dir={run_dir}", f"learner.model={tiny_gemma_dir}",
        f"frozen.model={tiny_gemma_dir}", "rollout.backend=hf", "frozen.backend=hf", "learner.lr=0.001",
        "learner.critic_lr=0.001", "train.questions_per_step=2", "rollout.samples_per_prompt=2",
        "learner.mini_batch_size=4", "learner.micro_batch_size=2", "rollout.max_new_tokens_per_turn=16",
        "rollout.max_total_tokens=1024", "rollout.cpus_per_worker=0.25", "frozen.num_cpus=0.25",
        "learner.cpus_per_rank=0.5", "train.eval_questions=2", "algorithm.entropy_coef=0.01",
        "algorithm.skip_zero_advantage=false",  # the zero-advantage groups carry the entropy bonus's gradient
        *overrides,
        config=config)


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _rollouts(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def _max_weight_change(before_dir, after_file) -> float:
    """Largest absolute difference between the initial policy and a checkpoint's HF weights."""
    from safetensors.torch import load_file

    before = load_file(str(Path(before_dir) / "model.safetensors"))
    after = load_file(str(after_file))
    return max((after[k].float() - before[k].float()).abs().max().item() for k in before if k in after)


@pytest.mark.slow
@pytest.mark.heavy
def test_two_steps_checkpoint_and_resume(ray_local, small_index, tiny_gemma_dir, tmp_path):
    from pipelines.checkpoints import last_checkpoint
    from pipelines.train import train

    cfg = _tiny_run(
        "configs/r1_searcher_cpu.yaml", small_index, tiny_gemma_dir, tmp_path, "train.save_every=1",
        "train.wandb.mode=offline", "train.keep_checkpoints=2",  # step 1 stays resumable: the crash below
        'train.stages=[{"steps": 1, "recipe_options": {"stage": 1}}, {"steps": 1, "recipe_options": {"stage": 2}}]',
    )
    run_dir = train(cfg, progress=False)
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2] and "dev/answer_f1" in rows[0]  # eval_every 10: step 0 and the end
    rows = rows[1:]
    assert [r["stage"] for r in rows] == [1, 2]
    for key in ("rollout/reward_mean", "rollout/turns_per_episode", "rollout/valid_action_rate", "actor/policy_loss",
                "actor/grad_norm", "time/rollout_s", "time/update_s", "time/sync_s"):
        assert key in rows[0], key
    assert "dev/reward_mean" in rows[1] and rows[0]["rollout/episodes"] == 4
    assert {"rollout/reward/retrieval", "rollout/reward/format"} <= set(rows[0])  # stage-1 reward components
    assert (run_dir / "reward_curves.png").is_file() and (run_dir / "config.yaml").is_file()
    assert list((run_dir / "wandb").glob("offline-run-*"))
    assert last_checkpoint(run_dir).name == "step-2"
    assert (run_dir / "checkpoints" / "step-2" / "policy" / "hf" / "model.safetensors").is_file()
    step2_episodes = _rollouts(run_dir / "rollouts" / "step-2.jsonl.gz")
    assert {e["weight_version"] for e in step2_episodes} == {1}  # workers got update 1's weights
    assert _max_weight_change(tiny_gemma_dir, run_dir / "checkpoints" / "step-2" / "policy" / "hf"
                              / "model.safetensors") > 1e-4
    step2 = [e["group_id"] for e in step2_episodes]

    assert all(list(p.glob("*/deepspeed")) for p in (run_dir / "checkpoints").glob("step-*"))  # both kept state
    # Stop after step 1: resume runs step 2 again, on the same questions.
    shutil.rmtree(run_dir / "checkpoints" / "step-2")
    (run_dir / "rollouts" / "step-2.jsonl.gz").unlink()
    saved = (run_dir / "config.yaml").read_bytes()
    resumed = train(load_config(run_dir / "config.yaml"), resume=run_dir, progress=False)
    assert resumed == run_dir and last_checkpoint(run_dir).name == "step-2"
    assert (run_dir / "config.yaml").read_bytes() == saved and not list(run_dir.glob("config.resume-*"))
    assert sorted(e["group_id"] for e in _rollouts(run_dir / "rollouts" / "step-2.jsonl.gz")) == sorted(step2)
    # The resume dropped step 2's row (logged after checkpoint step-1) and logged its own; no step-0 dev again.
    assert [r["step"] for r in _rows(run_dir)] == [0, 1, 2]


@pytest.mark.parametrize("path", sorted(str(p) for p in Path("configs").glob("*_[cg]pu.yaml")
                                        if p.name not in ("train_cpu.yaml", "train_gpu.yaml", "retrieval_cpu.yaml")))
def test_every_recipe_config_loads_and_builds_its_recipe(path):
    """Each shipped recipe config validates, names a trainable recipe, and its recipe options (per
    stage) build the recipe; GPU configs ask for GPUs for the engines and learners."""
    from cluster.roles import plan_roles, total_resources
    from recipes import get_recipe

    cfg = load_config(path)
    for step in range(total_steps(cfg)):
        get_recipe(cfg.train.recipe, stage_at(cfg, step)[1])
    episodes = cfg.train.questions_per_step * cfg.rollout.samples_per_prompt
    assert episodes % cfg.learner.mini_batch_size == 0, "episodes per step must fill whole mini-batches"
    assert (total_resources(plan_roles(cfg))["GPU"] > 0) == path.endswith("_gpu.yaml")


def _step_keys(cfg, components: set[str]) -> set[str]:
    """The metric keys every training step's row holds under `cfg`, with its recipe's reward `components`."""
    expected = {"rollout/reward_mean", "rollout/reward_std", "rollout/response_tokens", "rollout/turns_per_episode",
                "rollout/searches_per_episode", "rollout/valid_action_rate", "rollout/retrieval_latency_s",
                "rollout/score_s_per_episode", "rollout/finish/max_turns", "actor/policy_loss", "actor/entropy",
                "actor/clip_frac", "actor/grad_norm", "time/rollout_s", "time/update_s", "time/sync_s",
                *(f"rollout/reward/{c}" for c in components)}
    return expected | ({"critic/value_loss"} if cfg.algorithm.needs_critic else set())


# r1_searcher runs above (GRPO, stages, resume); search_r1's own step keys are checked by the expert warm
# start's run (its config, one step after the warm start); these are the other trainable recipes.
@pytest.mark.slow
@pytest.mark.parametrize("recipe, components", [
    ("s3", {"gen_acc_s3", "gen_acc_rag", "gain_beyond_rag"}),
    ("r_search", {"answer_f1", "evidence_f1", "format"}),
    # heavy: its reward terms are unit-tested; CI trains s3 (PPO, a critic) and R-Search (GRPO, a frozen judge)
    pytest.param("eval_rar", {"answer_em", "eval_contains_gold", "eval_reward"}, marks=pytest.mark.heavy),
])
def test_every_recipe_trains_two_steps(ray_local, small_index, tiny_gemma_dir, tmp_path, recipe, components):
    """Two real steps of each recipe's CPU config (its algorithm: PPO with a critic for s3, GRPO for
    the others): every expected metric key is written, the policy weights change, and the rollout
    workers generate step 2 with the weights of update 1."""
    from pipelines.checkpoints import last_checkpoint
    from pipelines.train import train

    cfg = _tiny_run(f"configs/{recipe}_cpu.yaml", small_index, tiny_gemma_dir, tmp_path, "train.total_steps=2",
                    "train.eval_every=2", "train.save_every=2", "train.wandb.mode=disabled")
    run_dir = train(cfg, progress=False)
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the dev evaluation before any update
    assert {"dev/answer_f1", "dev/answer_cover_em"} <= set(rows[0]) and "rollout/reward_mean" not in rows[0]
    rows = rows[1:]
    expected = _step_keys(cfg, components)
    assert expected <= set(rows[0]), sorted(expected - set(rows[0]))
    assert rows[0]["actor/grad_norm"] > 0  # reported under the CPU configs' ZeRO-0 too
    assert "dev/reward_mean" in rows[1]
    assert {e["weight_version"] for e in _rollouts(run_dir / "rollouts" / "step-1.jsonl.gz")} == {0}
    assert {e["weight_version"] for e in _rollouts(run_dir / "rollouts" / "step-2.jsonl.gz")} == {1}
    hf = last_checkpoint(run_dir) / "policy" / "hf" / "model.safetensors"
    assert _max_weight_change(tiny_gemma_dir, hf) > 1e-4


def _mean_response_logprobs(model_dir, episodes: list[dict], temperature: float = 1.0):
    """Mean log-probability of each episode's policy tokens (loss mask 1) under `model_dir`; shape (N,)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for e in episodes:
            ids = torch.tensor([e["prompt_ids"] + e["response_ids"]])
            logits = model(ids).logits[0, len(e["prompt_ids"]) - 1 : -1].float() / temperature
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(e["response_ids"])[:, None])[:, 0]
            mask = torch.tensor(e["loss_mask"], dtype=torch.float32)
            out.append(float((lp * mask).sum() / mask.sum()))
    return torch.tensor(out)


@pytest.mark.slow
def test_vllm_rollouts_and_a_scripted_reward_move_the_policy_toward_rewarded_episodes(
        ray_local, small_index, tiny_gemma_dir, tmp_path):
    """The path users take: rollouts on vLLM, a user recipe named by import path whose scripted reward
    splits each group, GRPO. Step 1's rewarded episodes become more likely under the step-1 weights and
    the unrewarded ones less likely; step 2 is generated by vLLM with the synced weights of update 1."""
    from pipelines.train import train

    cfg = _tiny_run(
        "configs/search_r1_cpu.yaml", small_index, tiny_gemma_dir, tmp_path, "train.recipe=tests.scripted_recipe:ParityReward",
        "rollout.backend=vllm", "rollout.cpu_kv_cache_gib=0.25", "rollout.max_model_len=1024",
        "algorithm.advantage_estimator=grpo", "algorithm.entropy_coef=0.0", "rollout.samples_per_prompt=4",
        "learner.mini_batch_size=8", "learner.micro_batch_size=4", "train.total_steps=2", "train.eval_every=0",
        "train.eval_questions=0", "train.save_every=1", "train.keep_checkpoints=2",  # step 1's weights are read below
        "train.wandb.mode=disabled",
    )
    run_dir = train(cfg, progress=False)
    rows = _rows(run_dir)
    assert rows[0]["rollout/reward_std"] > 0 and "rollout/reward/parity" in rows[0]
    step1 = _rollouts(run_dir / "rollouts" / "step-1.jsonl.gz")
    assert {e["weight_version"] for e in step1} == {0}
    assert {e["weight_version"] for e in _rollouts(run_dir / "rollouts" / "step-2.jsonl.gz")} == {1}
    rewards = torch.tensor([e["reward"] for e in step1])
    groups = {}
    for i, e in enumerate(step1):
        groups.setdefault(e["group_id"], []).append(i)
    advantage = torch.zeros(len(step1))  # the sign of GRPO's advantage: reward against its group's mean
    for idx in groups.values():
        advantage[idx] = rewards[idx] - rewards[idx].mean()
    assert (advantage != 0).any(), "the scripted reward must split at least one group"
    change = (_mean_response_logprobs(run_dir / "checkpoints" / "step-1" / "policy" / "hf", step1)
              - _mean_response_logprobs(tiny_gemma_dir, step1))
    assert change[advantage > 0].mean() > 0 > change[advantage < 0].mean(), (change, advantage)


def test_step_summary_names_the_headline_numbers_and_phase_times():
    from pipelines.train_metrics import step_summary

    line = step_summary({"rollout/reward_mean": 0.4567, "rollout/searches_per_episode": 1.25,
                         "rollout/valid_action_rate": 0.5, "time/rollout_s": 61.2, "time/prepare_s": 9.9,
                         "time/update_s": 120.4, "time/sync_s": 3.0})
    assert line == "reward 0.457 searches 1.25 valid 0.50 | rollout 61s prep 10s update 120s sync 3s"


def test_learning_trend_compares_the_first_and_last_third():
    from pipelines.train_metrics import format_trend, learning_trend

    rows = [{"step": i + 1, "rollout/reward_mean": r, "rollout/valid_action_rate": 0.5} for i, r in
            enumerate([0.0, 0.1, 0.2, 0.2, 0.4, 0.6, 0.5])]
    trend = {t["name"]: t for t in learning_trend(rows)}
    assert set(trend) == {"reward", "valid-action rate"} and trend["reward"]["steps"] == 2
    assert trend["reward"]["first"] == pytest.approx(0.05) and trend["reward"]["last"] == pytest.approx(0.55)
    assert trend["valid-action rate"]["change"] == 0.0
    assert "| reward | 0.050 | 0.550 | +0.500 |" in format_trend(list(trend.values()))
    assert learning_trend(rows[:1]) == [] and format_trend([]) == ""


def test_step_summary_of_a_select_only_recipe_names_its_own_numbers():
    """s3 select-only never searches, so the line shows its selections, documents kept and the
    generator's answer F1 instead of "searches 0.00"."""
    from configs.loader import load_config
    from pipelines.train_metrics import recipe_searches, step_summary

    metrics = {"rollout/reward_mean": 0.0123, "rollout/searches_per_episode": 0.0, "rollout/valid_action_rate": 0.97,
               "rollout/selected_docs_per_episode": 1.8125, "rollout/answer_f1": 0.1567, "time/rollout_s": 9.6,
               "time/prepare_s": 0.4, "time/update_s": 21.2, "time/sync_s": 11.0, "actor/skipped_groups": 3.0}
    s3_main = load_config("configs/s3_main_cpu.yaml")  # select-only: its step line shows selections, not searches
    assert not recipe_searches(s3_main) and recipe_searches(load_config("configs/main_cpu.yaml"))
    assert recipe_searches(load_config("configs/r1_searcher_cpu.yaml"))
    assert step_summary(metrics, searches=False) == ("reward 0.012 valid 0.97 docs 1.81 answer F1 0.157 | rollout 10s "
                                                     "prep 0s update 21s skipped 3 sync 11s")


def _questions_answerable_from_the_small_index(data_dir, path):
    """The training questions whose context passages are all among the small index's 600 (39 of them), as a
    QA file: an expert that searches with the question finds the gold answer for some of them."""
    import gzip

    rows = [r for r in (json.loads(line) for line in gzip.open(data_dir / "train.jsonl.gz", "rt"))
            if r.get("context_ids") and all(int(i.split("-")[1]) < 600 for i in r["context_ids"])]
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("source", [pytest.param("policy", marks=pytest.mark.heavy), "expert"])
def test_warm_start_fine_tunes_before_step_one(ray_local, small_index, tiny_gemma_dir, data_dir, tmp_path, source):
    """`train.warm_start`: supervised passes before step 1, on the untrained policy's episodes above `min_reward`
    (source policy; here every one: the tiny random model scores 0) or on the recipe's expert demonstrations
    (source expert: it searches with the question and answers with the gold answer a retrieved document holds;
    questions whose gold it never sees give none); its metrics are logged at step 0 after the dev row, and its
    questions count in the visits."""
    from pipelines.train import VISITS, train

    if source == "policy":
        ws = ["train.warm_start={questions: 3, samples: 2, min_reward: -1.0}"]
    else:
        qa = _questions_answerable_from_the_small_index(data_dir, tmp_path / "train-small.jsonl.gz")
        ws = ["train.warm_start={source: expert, questions: 12, lr: 3.0e-5}", f"data.train={qa}",
              "rollout.max_new_tokens_per_turn=96", "algorithm.kl_coef=0.001"]
    cfg = _tiny_run("configs/search_r1_cpu.yaml", small_index, tiny_gemma_dir, tmp_path, "train.total_steps=1",
                    "train.wandb.mode=disabled", *ws)
    run_dir = train(cfg, progress=False)
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == [0, 0, 1] and "dev/answer_f1" in rows[0]
    warm = rows[1]
    assert warm["warm_start/optimizer_steps"] >= 1 and "warm_start/policy_loss" in warm
    assert "dev/answer_f1" in warm  # the warm-started policy's own dev point
    assert 0.0 < warm["warm_start/token_prob_mean"] <= 1.0  # the supervised (NLL) pass's own metric
    if source == "expert":  # its own learning rate, not the RL schedule's
        assert warm["warm_start/lr"] == pytest.approx(3.0e-5)
    if source == "policy":
        assert warm["warm_start/episodes"] == warm["warm_start/kept"] == 6
        assert rows[2][VISITS] == 2 + 3  # one step of 2 questions after the warm start's 3
    else:  # one demonstration per question it could answer; each earns Search-R1's full reward (EM 1)
        assert warm["warm_start/episodes"] == 12 and 1 <= warm["warm_start/kept"] < 12
        assert warm["warm_start/kept_reward_mean"] == 1.0
        kept = warm["warm_start/kept_questions"]  # the visits count the questions trained on, not the 12 tried
        assert kept == warm["warm_start/kept"]  # the expert writes one demonstration a question
        assert rows[2][VISITS] == 2 + kept and warm[VISITS] == kept
        assert _step_keys(cfg, {"em"}) <= set(rows[2]), sorted(_step_keys(cfg, {"em"}) - set(rows[2]))
        assert rows[2]["actor/grad_norm"] > 0
        # the KL anchor is the warm-started policy: step 1 samples from it, so the KL to it is ~0
        # (the old log-prob pass's own figure; a one-step update has no such pass and logs the same as actor/kl)
        assert abs(rows[2].get("actor/kl_to_ref_rollout", rows[2].get("actor/kl", 1.0))) < 1e-3
        assert (run_dir / "checkpoints" / "warm-start" / "policy" / "hf" / "model.safetensors").is_file()
        state = json.loads((run_dir / "checkpoints" / "warm-start" / "trainer_state.json").read_text())
        assert state["dev_answer_f1"] == pytest.approx(warm["dev/answer_f1"]) and state["resumable"] is False
        best = (run_dir / "checkpoints" / "best").resolve()  # the warm start weighed against step 1
        want = "warm-start" if warm["dev/answer_f1"] > rows[2].get("dev/answer_f1", -1.0) else "step-1"
        assert best.name == want, (best, warm["dev/answer_f1"], rows[2].get("dev/answer_f1"))
