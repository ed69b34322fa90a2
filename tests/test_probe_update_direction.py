"""`scripts.probes.update_direction`: one replayed GRPO update from a saved checkpoint, measured on the first turn."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from scripts.probes.update_direction import first_turn_mask, first_turns, main

Q = '<query>{"query": "%s"}</query>'


def _traj(tok, group: str, question: str, first: str, reward: float) -> dict:
    """An s3 episode: a first turn (`first` then a query), the search's block (loss mask 0), a closing turn."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    turns = [first + Q % "key words", "\n<information>Doc 1: text</information>\n",
             "<search_complete>True</search_complete>"]
    ids = [enc(t) for t in turns]
    return {"group_id": group, "reward": reward, "prompt_ids": tok.encode(f"Question: {question}\n"),
            "response_ids": ids[0] + ids[1] + ids[2], "loss_mask": [1] * len(ids[0]) + [0] * len(ids[1]) + [1] * len(ids[2]),
            "logprobs": [0.0] * sum(map(len, ids)),
            "turns": [{"text": turns[0], "generated_tokens": len(ids[0])}, {"text": turns[2], "generated_tokens": len(ids[2])}]}


def _write(path, trajs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(t) + "\n" for t in trajs)


def test_first_turn_mask_covers_the_first_turns_policy_tokens_only():
    import torch

    trajs = [{"turns": [{"generated_tokens": 2}]}, {"turns": []}]
    loss_mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    assert first_turn_mask(trajs, loss_mask).tolist() == [[1, 1, 0, 0], [0, 0, 0, 0]]
    cut = first_turns([{"turns": [{"generated_tokens": 2}], "response_ids": [5, 6, 7], "loss_mask": [1, 1, 0],
                        "logprobs": [-1.0, -2.0, 0.0], "prompt_ids": [1]}])
    assert (cut[0]["response_ids"], cut[0]["loss_mask"], cut[0]["logprobs"], cut[0]["prompt_ids"]) == (
        [5, 6], [1, 1], [-1.0, -2.0], [1])


def test_a_checkpoint_the_run_did_not_save_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("train:\n  recipe: s3\n")
    assert main([str(tmp_path), "--checkpoint", "4"]) == 2
    assert "step-4: not there" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("train:\n  recipe: search_r1\n")
    assert main([str(tmp_path), "--checkpoint", "4"]) == 2  # not an s3 run
    assert "reads s3 runs" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.heavy  # two DeepSpeed processes (~1-3 min on 2 cores): CI's suite is at its 40-minute budget
def test_the_replayed_update_raises_the_first_selection_that_scored(tiny_gemma_dir, tmp_path):
    """Rewarded `[1]` against unrewarded `[]` in every group: the first-turn-only update raises log π of `[1]`'s
    first turn and lowers `[]`'s on the trained rows, from the checkpoint the run saved."""
    from transformers import AutoTokenizer

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        "train:\n  recipe: s3\n  recipe_options: {max_turns: 3, prefill: ''}\n"
        f"learner:\n  model: {tiny_gemma_dir}\n  dtype: fp32\n  lr: 1.0e-3\n  mini_batch_size: 12\n"
        "  micro_batch_size: 4\n  shuffle: false\nalgorithm:\n  kl_coef: 0.001\n  skip_zero_advantage: true\n")
    # DeepSpeed keeps its process group for the process: the checkpoint and the probe each get their own
    save = ("from configs.loader import load_config; from scripts.bench.learner_local import _learner; "
            f"cfg = load_config({str(run / 'config.yaml')!r}); "
            f"_learner(cfg, cfg.learner, False).save_checkpoint({str(run / 'checkpoints' / 'step-1')!r}, hf=False)")
    subprocess.run([sys.executable, "-c", save], check=True, capture_output=True)
    tok = AutoTokenizer.from_pretrained(tiny_gemma_dir)
    step = [_traj(tok, g, f"what is {g}?", sel, r) for g in ("a", "b")
            for sel, r in (("<important_info>[1]</important_info>", 1.0), ("<important_info>[]</important_info>", 0.0))
            for _ in range(2)]
    tied = [_traj(tok, "c", "a tie", "<important_info>[]</important_info>", 0.0) for _ in range(4)]
    _write(run / "rollouts" / "step-2.jsonl.gz", step + tied)
    _write(run / "rollouts" / "step-3.jsonl.gz", [_traj(tok, "d", "held out", "<important_info>[1]</important_info>", 0.0)])

    probe = subprocess.run([sys.executable, "-m", "scripts.probes.update_direction", str(run), "--checkpoint", "1",
                            "--heldout", "3", "--json"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    out = json.loads(probe.stdout.strip().splitlines()[-1])
    assert (out["rows"], out["episodes"]) == (8, 12)  # group c is tied: not trained
    assert out["signal"]["[1]"]["n"] == 4 and out["signal"]["[1]"]["sum"] > 0 > out["signal"]["[]"]["sum"]
    direct = out["first_turn"]["trained"]
    assert direct["[1]"]["mean"] > 0 > direct["[]"]["mean"]
    # the checkpoint was saved before any update: no first moment, so the momentum-only step moves nothing
    # (weight decay alone)
    assert abs(out["momentum"]["trained"]["[1]"]["mean"]) < abs(direct["[1]"]["mean"]) / 100
    assert out["full"]["heldout"]["[1]"]["n"] == 1
