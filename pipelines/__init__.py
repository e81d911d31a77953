"""The jobs of beam-pretokenize: one module each, plus the `pretokenize` console script."""
