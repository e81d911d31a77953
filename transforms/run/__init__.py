"""A job's run over its input units, one floor above the core it runs: each unit's steps in one bundle
(steps.py, RunUnits), resumed from its marker (resume.py, ProcessUnits), and the run's provenance
(provenance.py: the inputs and tokenizer files it names). Above transforms.core, transforms.inputs and
transforms.tokenizers, which import nothing of it."""
