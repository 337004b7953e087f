"""Shared test helpers: a toy affine cost model for hand-worked cases."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

# Tests that read the CLI's tables give it their own width (CliRunner's env COLUMNS). rich fixes a console's width for
# good when COLUMNS is set as the console is made (the CLI's consoles are made when it is imported), and pytest-xdist's
# workers, like some shells, run with COLUMNS set (80), so it is removed before any test module imports the CLI.
os.environ.pop("COLUMNS", None)

# CI (CI=true) draws the same hypothesis examples on every run, so a submission's result does not depend on the
# random draw; local runs keep drawing new examples (that is how the EcoServe group-release deadlock was found).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

from infermax.costmodel import AffinePiece, CostTerm


class AffineCost:
    """Batch time = ``base_s + per_token_s * n_tokens`` (0 for an empty batch)."""

    name = "affine"

    def __init__(self, base_s: float = 1.0, per_token_s: float = 1.0):
        self.base_s, self.per_token_s = base_s, per_token_s

    def batch_time_s(self, f) -> float:
        return 0.0 if f.n_tokens == 0 else self.base_s + self.per_token_s * f.n_tokens

    def predict_s(self, table):
        n = table["n_tokens"].to_numpy(float)
        return np.where(n > 0, self.base_s + self.per_token_s * n, 0.0)

    def milp_terms(self):
        return (CostTerm("affine", "n_tokens", (AffinePiece(self.base_s, {"n_tokens": self.per_token_s}),)),)


@pytest.fixture
def affine():
    return AffineCost()
