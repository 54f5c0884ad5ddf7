"""The test ids and packages the release matrix's tests share (test_matrix.py, test_matrix_cli.py)."""

H = "shape mismatch in all_gather #3 of group default: rank 0 [2, 7, 32], rank 1 [2, 5, 32] (call site trl/x.py:12)"
M = "suites.trl.matrix.test_matrix::"
SFT, DPO, GRPO = M + "test_cell[sft-ragged]", M + "test_cell[dpo-even]", M + "test_cell[grpo-big]"
PKGS = {"transformers": "4.49.0", "accelerate": "1.4.0", "datasets": "3.3.2", "torch": "2.13.0+cpu"}

NOTES = '''
[[note]]
rows = ["cpo \u00b7 *", "orpo \u00b7 ragged"]
text = "trl#3068: logits gathered with a per-rank length"

[[note]]
rows = ["grpo \u00b7 *"]
text = "trained 0 steps"
new = true
'''
