"""Judgements made from the store: each GPU's verdict and the findings the status page and /health/gpus show."""
