"""Composite PTransforms of beam-pretokenize and the DoFns and plain functions behind them."""
