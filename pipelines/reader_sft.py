"""A reader fine-tuned to serve as s3's frozen generator.

s3 asks only that the generator stays frozen while the searcher trains (s3 §3.1); which model it is, is a
choice. Gemma 3 270M base reads poorly (naive RAG F1 0.086 on 1,000 test questions): most questions give
F1 0 whatever the searcher selects, so Gain Beyond RAG is 0 for most GRPO groups and they are left out.
This module fine-tunes a model on the generator's own task, in its own prompt (s3 Fig. 12,
`recipes.base.ANSWER_PROMPT`, rendered by `actors.frozen.scorer.answer_prompt_ids` as the frozen model
reads it) with the gold answer as the reply, so that what the searcher puts in the context decides the answer.

Each training question gives the contexts `reader_contexts` builds, each holding a gold answer as a token
span (s3 Eq. 3's span check): the question's top-k when it holds one (naive RAG's context), and a
selection as an s3 searcher writes one, the first gold-holding document of a longer ranking with 0 to k-1
of the ranking's other documents, in a random order; optionally (`long_docs`) a long context as an s3
searcher that leaves every block whole builds one, the top-k followed by further documents of the ranking
(a reader trained on 1-3 documents reads a 12-document context worse: on 256 dev questions its F1 when the
context holds a gold answer fell from 0.41 with naive RAG's 3 to 0.32 with a searcher's 12). The reply is
the gold answer found in the context.
The pass is the policy learner's supervised update (the warm start's: `algorithm.policy_loss: nll`, no KL),
on one rank in this process. Then `frozen.model=<out>/policy/hf` serves it as the generator; naive RAG
must use the same one (`scripts.evaluate` does: both read `frozen.model`).

The reader trains on questions of the training split, which the searcher's run samples from too: a
question seen here may be answered from memory whatever the context (its group's rewards then tie).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import Any

from recipes.base import ANSWER_PROMPT, Doc
from recipes.metrics import span_check
from recipes.search_metrics import doc_holds_answer

log = logging.getLogger(__name__)


def answer_in(docs: Sequence[Doc], golden_answers: Sequence[str]) -> str | None:
    """The first gold answer that `docs` (title and text) hold as a token span (s3 Eq. 3's span check);
    None when none does."""
    text = " ".join(f"{d.title} {d.text}" for d in docs)
    return next((a for a in golden_answers if span_check(text, [a])), None)


def reader_contexts(ranked: Sequence[Doc], golden_answers: Sequence[str], k: int,
                    rng: random.Random, long_docs: int = 0) -> list[list[Doc]]:
    """The contexts one question gives the reader, each holding a gold answer.

    Args:
        ranked: the question's documents, best first (a retriever's top-n, n >= k).
        golden_answers: the accepted answers.
        k: documents per search (`retrieval.topk`; s3: 3).
        rng: draws the selection's size and order.
        long_docs: > k adds a third context of this many documents, as an s3 searcher that leaves every block
            whole builds one (the top-k, then what its searches brought): the top-k followed by `long_docs` − k
            documents of `ranked[k:]` in a random order, the first gold-holding one among them when the top-k
            holds none. 0 = no such context.
    Returns:
        Up to three contexts: the top-k when it holds a gold answer (naive RAG's), a selection (the first
        gold-holding document of `ranked` with 0 to k-1 other documents of `ranked` that hold none, shuffled),
        and the long context when `long_docs` > k. Empty when no document of `ranked` holds a gold answer.
    """
    holds = [doc_holds_answer(d, golden_answers) for d in ranked]  # one span check per document
    holding = [d for d, h in zip(ranked, holds) if h]
    if not holding:
        return []
    out = [list(ranked[:k])] if any(holds[:k]) else []
    others = [d for d, h in zip(ranked, holds) if not h]
    selection = [holding[0], *rng.sample(others, min(len(others), rng.randint(0, k - 1)))]
    rng.shuffle(selection)
    out.append(selection)
    if long_docs > k and len(ranked) > k:
        out.append(_long_context(ranked, holds, k, long_docs, rng))
    return out


def _long_context(ranked: Sequence[Doc], holds: Sequence[bool], k: int, n: int, rng: random.Random) -> list[Doc]:
    """The top-k then n − k shuffled documents of `ranked[k:]`, the first gold-holding one of them among them
    when the top-k holds none (so the context always holds a gold answer)."""
    rest = list(range(k, len(ranked)))
    must = [] if any(holds[:k]) else [next(i for i in rest if holds[i])]
    pool = [i for i in rest if i not in must]
    extra = must + rng.sample(pool, min(len(pool), n - k - len(must)))
    rng.shuffle(extra)
    return [*ranked[:k], *(ranked[i] for i in extra)]


def reply_ids(tokenizer: Any, prompt: str, answer: str, chat: bool) -> list[int]:
    """Token ids of `answer` as the frozen model's reply to `prompt`: a base model's text after the
    "Answer:" cue, ended by the newline `FrozenLLM` stops at; a chat model's assistant turn with its end token.

    Raises:
        ValueError: the chat template renders the conversation with another prefix than the prompt alone.
    """
    from actors.frozen.scorer import answer_prompt_ids

    if not chat:
        return list(tokenizer.encode(f" {answer}\n", add_special_tokens=False))
    head = answer_prompt_ids(tokenizer, prompt, chat=True)
    full = list(tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                               {"role": "assistant", "content": answer}],
                                              tokenize=True, return_dict=False))
    if full[: len(head)] != head:
        raise ValueError("reply_ids: the chat template renders the assistant turn after a different prefix than "
                         "the generation prompt; this model cannot be trained as a chat reader here")
    return full[len(head):]


def reader_rows(question: str, qid: str, golden_answers: Sequence[str], contexts: Sequence[Sequence[Doc]],
                format_docs: Any, tokenizer: Any, chat: bool, max_tokens: int) -> list[dict]:
    """Supervised rows (`Trajectory.to_json()`-shaped dicts: `prompt_ids`, `response_ids`, `loss_mask` all 1,
    `logprobs` 0, `group_id` `<qid>/<i>`) of one question: the s3 Fig. 12 prompt over each context, the gold
    answer it holds as the reply. `format_docs`: the recipe's (`Recipe.format_docs`), so the reader sees
    documents as the searcher's generator will. A row longer than `max_tokens` (prompt + reply) is dropped."""
    from actors.frozen.scorer import answer_prompt_ids

    rows = []
    for i, docs in enumerate(contexts):
        answer = answer_in(docs, golden_answers)
        if answer is None:
            continue
        prompt = ANSWER_PROMPT.format(question=question, context=format_docs(docs))
        head, reply = answer_prompt_ids(tokenizer, prompt, chat), reply_ids(tokenizer, prompt, answer, chat)
        if len(head) + len(reply) > max_tokens:
            continue
        rows.append({"prompt_ids": head, "response_ids": reply, "loss_mask": [1] * len(reply),
                     "logprobs": [0.0] * len(reply), "group_id": f"{qid}/{i}"})
    return rows


def train_reader(cfg: Any, rows: Sequence[dict], out_dir: str, *, model: str, pad_token_id: int, epochs: int,
                 lr: float, seed: int = 0, chunk_mini_batches: int = 8) -> dict[str, float]:
    """Fine-tune `model` on `rows` with the policy learner's supervised update, on one rank in this process
    (DeepSpeed; the config's learner settings: dtype, ZeRO stage, micro- and mini-batch sizes, frozen
    embeddings), and write it to `<out_dir>/policy/hf`.

    Args:
        cfg: the run's `Config` (its `learner` and `algorithm` settings).
        rows: from `reader_rows`.
        model: the reader's starting weights (a Hugging Face name, a local directory or 'gemma3-270m').
        pad_token_id: its tokenizer's pad id (the EOS id when it has none).
        epochs: passes over `rows` (shuffled each pass, seeded).
        lr: the learning rate of every optimizer step (no schedule).
        chunk_mini_batches: mini-batches per learner call (one progress line each).
    Returns:
        rows, optimizer_steps, update_s (seconds), nll_first / nll_last (token-mean negative
        log-likelihood of the first and last call, nats), and `model_dir`.
    Raises:
        ValueError: no rows, or `epochs` below 1.
    """
    import time

    import torch.distributed as dist

    from actors.learner.policy import PolicyLearner
    from actors.learner.rank import free_port
    from pipelines.warm_start import supervised_algorithm, supervised_batch

    if not rows or epochs < 1:
        raise ValueError(f"train_reader: need rows ({len(rows)}) and epochs >= 1 ({epochs})")
    rng = random.Random(seed)
    order = [r for _ in range(epochs) for r in rng.sample(list(rows), len(rows))]
    mini = cfg.learner.mini_batch_size
    chunk = mini * chunk_mini_batches
    chunks = [order[i:i + chunk] for i in range(0, len(order), chunk)]
    learner_cfg = cfg.learner.model_copy(update={"model": model, "num_ranks": 1})
    learner = PolicyLearner(learner_cfg, temperature=1.0, total_steps=len(chunks))
    if not dist.is_initialized():
        learner.init_distributed("127.0.0.1", free_port())
    learner.setup()
    algorithm = supervised_algorithm(cfg.algorithm)
    losses, steps, t0 = [], 0, time.perf_counter()
    try:
        for i, part in enumerate(chunks):
            m = learner.update(supervised_batch(part, mini, pad_token_id), algorithm, lr=lr)
            losses.append(float(m["policy_loss"]))
            steps += int(m.get("optimizer_steps", 0))
            log.info("reader: chunk %d/%d (%d rows): NLL %.3f, %.0f s so far", i + 1, len(chunks), len(part),
                     losses[-1], time.perf_counter() - t0)
        target = learner.save_hf(out_dir)
    finally:
        learner.shutdown()
    return {"rows": float(len(order)), "optimizer_steps": float(steps), "update_s": time.perf_counter() - t0,
            "nll_first": losses[0], "nll_last": losses[-1], "model_dir": f"{target}/hf"}
