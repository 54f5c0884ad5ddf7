"""The tiny tokenizer/model factory the suites stand on (controller side, no ranks), and the
device a trainer gets on a rank."""

import re

import pytest

from pytest_nccl.testing import trl_compat as compat  # first: offline HF environment

# isort: split
from pytest_nccl.testing import data, tiny_causal_lm, tiny_tokenizer


def test_tokenizer_is_byte_level_and_prefix_stable():
    tok = tiny_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok("hello world")["input_ids"]) == len("hello world")
    assert tok.decode(tok("héllo, world")["input_ids"]) == "héllo, world"
    prompt, completion = "abc", " def"
    full = tok(prompt + completion)["input_ids"]
    assert full[: len(tok(prompt)["input_ids"])] == tok(prompt)["input_ids"]
    assert "token_type_ids" not in tok("x")


def test_chat_template_renders_roles_and_generation_prompt():
    tok = tiny_tokenizer()
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == "<|user|>hi<|end|><|assistant|>yo<|end|>"
    prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|user|>hi<|end|><|assistant|>"


def test_models_are_tiny_seeded_and_match_the_tokenizer():
    import torch

    tok = tiny_tokenizer()
    for kind in ("llama", "qwen2"):
        a, b = tiny_causal_lm(kind, tokenizer=tok), tiny_causal_lm(kind, tokenizer=tok)
        assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
        assert sum(p.numel() for p in a.parameters()) < 50_000
        assert a.config.vocab_size == len(tok) and a.config.pad_token_id == tok.pad_token_id
        out = a(**tok(["ab", "abcd"], padding=True, return_tensors="pt"))
        assert out.logits.shape == (2, 4, len(tok))
    c = tiny_causal_lm("llama", tokenizer=tok, seed=1)
    assert not torch.equal(next(a.parameters()), next(c.parameters()))


def test_compat_finds_every_trainer_and_translates_fields(tmp_path):
    for name in ("sft", "cpo", "orpo", "grpo"):
        trainer_cls, config_cls = compat.classes(name)
        assert trainer_cls.__name__.lower().startswith(name)
    args = compat.make_config("sft", tmp_path, max_length=24, max_steps=1)
    assert getattr(args, "max_length", None) == 24 or getattr(args, "max_seq_length", None) == 24
    assert args.save_strategy == "no" and not args.report_to
    import torch

    assert args.use_cpu == (not torch.cuda.is_available())  # no group here: the device CUDA offers
    assert compat.make_config("sft", tmp_path, use_cpu=True).use_cpu  # what a test says wins


def test_a_setup_error_fails_on_a_known_trl_and_skips_on_a_newer(tmp_path, monkeypatch):
    """TRL's own config class, given a field no TRL has: the error TRL raises, as it is, where the
    installed TRL is one the suites know; a skip naming it where TRL is newer."""
    from pytest_nccl.testing import releases

    installed = releases.installed_version("trl")
    monkeypatch.setitem(releases.TESTED_THROUGH, "trl", installed)
    with pytest.raises(TypeError, match="no_trl_has_this_field"):
        compat.make_config("sft", tmp_path, no_trl_has_this_field=1)
    monkeypatch.setitem(releases.TESTED_THROUGH, "trl", "0.1.0")
    with pytest.raises(pytest.skip.Exception, match=rf"SFTConfig: the set-up broke on trl {re.escape(installed)} "
                                                    r"\(tested through 0\.1\.0\).*TypeError: .*no_trl_has_this_field"):
        compat.make_config("sft", tmp_path, no_trl_has_this_field=1)


def test_data_bands():
    """Rank bands are disjoint in tokens (so padded lengths differ), counts are uneven, and the
    control has one length everywhere."""
    tok = tiny_tokenizer()

    def n_tokens(row):
        return len(tok(row if isinstance(row, str) else "".join(m["content"] for m in row))["input_ids"])

    for rows in (data.text_rows, data.conversation_rows):
        n0 = [n_tokens(x) for x in next(iter(rows(0).values()))]
        n1 = [n_tokens(x) for x in next(iter(rows(1).values()))]
        assert max(n0) < min(n1) and len(n0) < len(n1)
    assert max(data.lengths(0)) < min(data.lengths(1))
    assert len(data.lengths(1)) > len(data.lengths(0))
    assert set(data.lengths(0, ragged=False)) == set(data.lengths(1, ragged=False)) == {8}
    rows = data.preference_rows(1)
    assert all(len(c) == n for c, n in zip(rows["chosen"], data.lengths(1), strict=True))


def test_matrix_cells_are_generated_from_the_trainer_table():
    from pytest_nccl.testing import trl_matrix as matrix

    cells = matrix.cells()
    assert len(cells) == len(set(cells)) == sum(len(t.stressors) for t in matrix.TRAINERS)
    assert {s for _, s in cells} == set(matrix.STRESSORS)  # every stressor is used and described
    assert set(matrix.BY_NAME) <= set(compat.NAMES)
    assert ("kto", "one_sided_labels") in cells and ("sft", "one_sided_labels") not in cells
    assert all(not s.startswith("all_masked") or matrix.BY_NAME[t].online for t, s in cells)


def test_matrix_rows_are_equal_in_count_and_odd_only_on_the_last_rank():
    """Every rank holds the same row count (the samplers' contract); what differs is content."""
    from pytest_nccl.testing import trl_matrix as matrix

    for world in (2, 3, 4):
        for trainer, stressor in matrix.cells():
            spec = matrix.BY_NAME[trainer]
            per_rank = [matrix.rows_for(spec, stressor, r, world) for r in range(world)]
            counts = {len(next(iter(rows.values()))) for rows in per_rank}
            assert len(counts) == 1, (trainer, stressor, world, counts)
        spec = matrix.BY_NAME["kto"]
        labels = [set(matrix.rows_for(spec, "one_sided_labels", r, world)["label"]) for r in range(world)]
        assert labels[-1] == {False} and all(lab == {True, False} for lab in labels[:-1])
        evals = [len(matrix.eval_rows_for(spec, r, world)["label"]) for r in range(world)]
        assert evals == [2 * world] * (world - 1) + [2 * world - 1]
    uneven = matrix.rows_for(matrix.BY_NAME["sft"], "uneven_rows", 0, 2)["text"]
    assert len(uneven) % (matrix.BATCH * 2) == 1  # a remainder row: one rank's share is larger


def test_matrix_cells_run_or_say_why_not_on_this_trl():
    from pytest_nccl.testing import trl_matrix as matrix

    for trainer, stressor in matrix.cells():
        why = matrix.unsupported(trainer, stressor)
        assert why is None or trainer in why or stressor in why or "RLOO" in why, why


def test_matrix_page_describes_every_stressor_as_the_code_does():
    """MATRIX.md's legend (notes.toml's about) must not drift from what the cells do."""
    import pathlib

    try:
        import tomllib
    except ImportError:  # Python 3.10: the package depends on tomli there
        import tomli as tomllib

    from pytest_nccl.testing import trl_matrix as matrix

    about = tomllib.loads((pathlib.Path(__file__).parent / "matrix" / "notes.toml").read_text())["about"]
    for name, text in matrix.STRESSORS.items():
        assert f"- `{name}`: {text}\n" in about, name


def test_compat_sees_through_deprecation_shims():
    """trl 0.2x's ``trl.KTOTrainer`` is ``__init__(self, *args, **kwargs)`` over the real trainer:
    the parameters are the real trainer's, so the tokenizer goes in as processing_class."""
    import types

    class Real:
        def __init__(self, model, args=None, processing_class=None, ref_model=None):
            pass

    class Shim(Real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)

    fake = types.ModuleType("fake_trl_shim")
    fake.KTOTrainer, fake.KTOConfig = Shim, object
    import sys

    sys.modules["fake_trl_shim"] = fake
    saved = compat._LOCATIONS["kto"]
    compat._LOCATIONS["kto"] = [("fake_trl_shim", "KTOTrainer", "KTOConfig")]
    try:
        assert compat.trainer_params("kto") == {"self", "model", "args", "processing_class", "ref_model"}
    finally:
        compat._LOCATIONS["kto"] = saved
        del sys.modules["fake_trl_shim"]


def test_matrix_page_is_what_its_results_and_notes_give():
    """MATRIX.md is generated: re-rendering results.json with notes.toml gives the committed page,
    and every row of the results is a cell the suite has now (no stale rows after a rename)."""
    import pathlib

    from pytest_nccl.bisect.matrix.findings import parse_about, parse_notes
    from pytest_nccl.bisect.matrix.render import render
    from pytest_nccl.bisect.matrix.results import Results
    from pytest_nccl.testing import trl_matrix as matrix

    here = pathlib.Path(__file__).parent
    results = Results.load(here / "matrix" / "results.json")
    notes = (here / "matrix" / "notes.toml").read_text()
    page = render(results, notes=parse_notes(notes), about=parse_about(notes))
    assert (here / "MATRIX.md").read_text() == page, "MATRIX.md is stale: python -m pytest_nccl matrix --render-only"
    cells = {f"suites.trl.matrix.test_matrix::test_cell[{t}-{s}]" for t, s in matrix.cells()}
    assert set(results.nodeids()) <= cells, sorted(set(results.nodeids()) - cells)
    newest = results.versions[-1]
    for world in results.worlds:
        assert set(results.get(newest, world).tests) == cells, (newest, world)


@pytest.mark.nccl
def test_trainers_run_on_the_device_of_the_rank(tmp_path, device):
    """On NCCL a trainer runs on the rank's GPU (use_cpu=True would hand CPU tensors to NCCL); on
    gloo on the CPU, as the plugin's ``device`` fixture says."""
    import torch.distributed as dist

    args = compat.make_config("sft", tmp_path, max_steps=1)
    assert args.use_cpu == (dist.get_backend() != "nccl") == (device.type == "cpu")
