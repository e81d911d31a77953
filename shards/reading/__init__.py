"""The reader's parts, one module a concern; ``shards.reader`` is the public API and re-exports
what a user needs. From the bottom up (each module imports only modules listed before it):

- ``hashes``: the validation split's key, the window generator's uniforms, the epoch ``Permutation``;
- ``records``: ``DocumentInfo``, ``Window``, ``Batch``, ``stack_windows``, ``block_causal_mask``;
- ``store``: the token files as one stream (``TokenStore``) and the document table (``Documents``,
  ``IndexedDocuments`` over a mapped reader index);
- ``streams``: selected documents as one stream (``DocumentStream``), windows and batches read from
  it, and where an epoch cuts it (``WindowCut``);
- ``epochs``: mixing sources into an epoch (``EpochMix``, ``apportion``) and the check of a saved
  state's fingerprint;
- ``samplers``: ``WindowSampler`` and ``LengthSampler``;
- ``shard_tree``: the opened tree (``ShardTree``), its selections and its samplers;
- ``opening``: ``open_tree`` (a kind's opener: reader index, manifest, llm.c shards) and ``open_llmc``.

Only numpy here (and fsspec for remote trees): no Beam, no torch.
"""
