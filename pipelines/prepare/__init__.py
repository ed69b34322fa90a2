"""Training-set preparation (CLI: ``python -m scripts.prepare_data {s3,r1_difficulty,import_flashrag}``).

One module per job; import the names from the module:

- ``pipelines.prepare.common``: what the jobs share: ``PrepareError``, ``Progress``, QA row
  reading (``read_qa_rows``, ``row_dataset``), atomic writers (``write_jsonl_gz``, ``write_json``),
  the per-question ``ResultCache`` and ``settings_fingerprint``, the recipe config
  (``recipe_config``), the index identity, and the Ray / actor session (``actor_session``,
  ``retrieval_pool``).
- ``pipelines.prepare.s3_filter``: the ``s3`` job (s3 §4.1): the naive-RAG GenAcc baseline and the
  filter: ``s3_filter_decision``, ``s3_filter_rows``, ``s3_settings``, ``prepare_s3``.
- ``pipelines.prepare.r1_difficulty``: the ``r1_difficulty`` job (R1-Searcher §2.1, Table 1):
  ``R1_TABLE1``, ``answer_correct``, ``first_correct``, ``difficulty_bucket``,
  ``normalize_dataset``, ``scale_table``, ``mix_by_quotas``, ``difficulty_fields``,
  ``run_difficulty_rounds``, ``r1_settings``, ``prepare_r1_difficulty``.
- ``pipelines.prepare.flashrag``: the ``import_flashrag`` job: ``flashrag_qa_row``,
  ``flashrag_corpus_row``, ``import_flashrag_qa``, ``import_flashrag_corpus``.

Fields added to QA rows are top-level row fields (``rag_gen_acc``; ``difficulty``,
``correct_of_n``, ``rollouts``, ``rollouts_to_correct``): ``pipelines.data.iter_qa`` puts every
extra field into ``QAExample.meta``, and the agent loop hands that dict to ``Recipe.start(meta=)``.
The pure parts (filter decisions, bucketing, Table-1 scaling and mixing, row conversion, cache)
are plain functions without Ray; the drivers ``prepare_s3`` and ``prepare_r1_difficulty`` check
the config before any actor starts, and accept already-started actor handles (tests, notebooks).

This package imports nothing itself (import-light).
"""
