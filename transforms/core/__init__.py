"""The core both jobs share: read documents in batches, spill their tokens, shuffle compact
references, write files, publish once (each module's docstring says its part):

    ReadDocuments     input units -> DocBatch (Arrow columns of one input file), drops counted
                      (transforms.inputs: the input formats)
    (the job's own)   DocBatch -> TokenBatch (all tokens of a batch end to end, one length each)
    SpillTokens       TokenBatch -> (group key, RefBatch): tokens go to the bundle's spill file,
                      only references (id, length, offset, sort key) per group go on
    (the job's own)   groups of RefBatches -> files staged
    PublishOutput     staged files -> the published tree, after the accounting check
"""
