"""The evaluation and data-preparation sections (`eval`, `prepare`); `configs.schema` re-exports them and `Config`
holds them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from configs.schema_retrieval import StrictModel


class EvalConfig(StrictModel):
    """How a trained searcher is evaluated (`pipelines/evaluate.py`, and what serving may read): the papers
    evaluate with settings of their own (R-Search §4.3: top-5 for every method; A.3: temperature 0.1).
    None keeps the training value."""

    topk: int | None = Field(
        None, gt=0, description="Passages per search, for every method (R-Search §4.3: 5); None = retrieval.topk.",
    )
    temperature: float = Field(
        0.0, ge=0, description="Decoding temperature of every method; 0 = greedy (R-Search A.3: 0.1).",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling when temperature > 0.")
    max_turns: int | None = Field(
        None, ge=0, description="Searches per episode of the searcher; None = its training max_turns.",
    )
    judge_model: str | None = Field(
        None, description="GenAcc judge at evaluation; None = frozen.judge_model, else frozen.model.",
    )
    frozen_backend: Literal["vllm", "hf"] | None = Field(
        None, description="Engine of the frozen generator / judge at evaluation; None = frozen.backend. Training "
        "may run the generator on hf to save memory (one process) while evaluation, with the learners gone, "
        "takes vLLM's faster prefill (measured: hf 5.5 s per naive-RAG answer here).",
    )
    mirage_questions: int = Field(
        0, ge=0, description="MIRAGE questions evaluated beside the QA file (a seeded sample spread over its five "
        "sets; more than the file holds = all of it), scored by the judge alone (s3 A.4); 0 = none.",
    )
    acc_l: bool = Field(
        False, description="Add R1-Searcher's ACC_L column (§3.1 LLM-as-Judge with the paper's Judge Prompt; the "
        "evaluation's judge model stands in for GPT-4o-mini).",
    )


class PrepareConfig(StrictModel):
    """Data-preparation jobs (`scripts.prepare_data`) that run a model of their own."""

    r1_selection_model: str | None = Field(
        None, description="Policy whose rollouts bucket questions by difficulty (R1-Searcher §2.1: "
        "Qwen/Qwen2.5-7B-Instruct); None = learner.model.",
    )
    r1_selection_chat: bool | None = Field(
        None, description="Chat template for it; None = rollout.chat (and that None = when the tokenizer has one).",
    )
