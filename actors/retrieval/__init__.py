"""Retrieval: index build pieces, shard search, the pool that merges shards, the HTTP route.

- `shard`: `ShardSearcher` (one FAISS / bm25s shard + its documents), `merge_topk`, `same_topk`,
  `Hit`, `ShardUnavailableError`, `RetrievalRequestError`.
- `pool`: `RetrievalPool` (encode, fan out, merge global top-k, micro-batch, retry) and
  `start_retrieval_pool`.
- `encoder`: `EncoderSpec`, `TextEncoder` (query actors), `PassageEncoderUDF` (Ray Data index build).
- `index_store`: the on-disk index: `Manifest`, `DocStore`, FAISS factories, checksums.
- `request`: `RetrieveRequest`, `parse_body`, `check_search`: the one validator of search requests
  (the route and the pool), with the limits of `retrieval.*`.
- `http`: `serve_retrieval`, the Ray Serve `/retrieve` route (Search-R1 wire format; 413 / 408 limits).
"""
