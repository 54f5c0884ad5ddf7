"""Shared pieces of the ZeRO suite: tiny models, DeepSpeed / FSDP2 wrappers, per-test cleanup.

Imported by every test module here, so (through the plugin's fork server) every rank starts with
DeepSpeed, its ZeRO runtime, ``torch._dynamo`` (DeepSpeed's optimizer setup imports it lazily:
~6-10 s per fresh rank on 2 cores otherwise), transformers' Llama and TRL already imported.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read by deepspeed.accelerator on first use

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from pytest_nccl.testing import hf_offline_env, tiny_causal_lm, tiny_tokenizer  # noqa: E402

hf_offline_env()

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
if HAVE_DEEPSPEED:
    import deepspeed  # noqa: E402
    import deepspeed.runtime.engine  # noqa: E402,F401
    import deepspeed.runtime.zero.stage3  # noqa: E402,F401
    import deepspeed.runtime.zero.stage_1_and_2  # noqa: E402,F401
    import torch._dynamo  # noqa: E402,F401
    try:  # imported by the optimizer sanity check of deepspeed.initialize (heavy, via torch.compile)
        import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: E402,F401
    except ImportError:
        pass
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    deepspeed.utils.logger.setLevel(logging.WARNING)

if importlib.util.find_spec("transformers") is not None:
    import transformers.models.llama.modeling_llama  # noqa: E402,F401

from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

ENGINES = ("deepspeed", "fsdp2")

# What each engine's parameter all-gather is called in a headline. DeepSpeed calls the (deprecated
# in torch 2.13) all_gather_into_tensor from Python. FSDP2 calls dist.all_gather_single, which a
# Python-level trace names as such; torch's Flight Recorder names it all_gather / _allgather_base.
ALL_GATHER = {
    "deepspeed": r"\ball_gather_into_tensor\b",
    "fsdp2": r"(?i)\b_?all_?gather(_single|_into_tensor|_base)?\b",
}


def all_gather_op(engine_kind: str) -> str:
    return ALL_GATHER["deepspeed" if engine_kind.startswith("deepspeed") else "fsdp2"]


# -- models -----------------------------------------------------------------------------------------

class TinyVLM(nn.Module):
    """A vision tower + projector feeding a one-block language model, like Qwen2-VL in VLM-R1 at
    toy size. Image patches become the first positions of the sequence; text-only batches skip the
    vision submodule, which is exactly what desyncs ZeRO-3 / FSDP2 (each submodule's forward
    gathers its own parameters)."""

    def __init__(self, vocab: int = 32, hidden: int = 32, patch: int = 16):
        super().__init__()
        self.patch = patch
        self.embed = nn.Embedding(vocab, hidden)
        self.vision = nn.Sequential(nn.Linear(patch, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.block = nn.Linear(hidden, hidden)
        self.lm_head = nn.Linear(hidden, vocab)
        # The VLM-R1 fix (commit 95b721e): agree across ranks whether anyone has images, and run
        # the vision tower on a dummy input where this rank has none.
        self.sync_modalities = False

    def forward(self, input_ids, pixel_values=None):
        h = self.embed(input_ids)
        n_text = h.shape[1]
        if self.sync_modalities:
            flag = torch.tensor([0 if pixel_values is None else 1], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            anyone_has_images = bool(flag.item())
        else:
            anyone_has_images = False
        if pixel_values is not None:
            h = torch.cat([self.vision(pixel_values), h], dim=1)
        elif anyone_has_images:
            dummy = torch.zeros(1, 1, self.patch, dtype=h.dtype)
            h = h + 0.0 * self.vision(dummy).sum()  # keeps the tower in the graph: backward too
        logits = self.lm_head(torch.tanh(self.block(h)))
        logits = logits[:, -n_text:]
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), input_ids.reshape(-1))


def tiny_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def tiny_lm(num_hidden_layers: int = 2):
    """(model, tokenizer): a 2-layer hidden-16 Llama with the byte tokenizer, EOS stopping off so
    the number of generation steps depends only on prompt length and max_length."""
    tok = tiny_tokenizer(padding_side="left")
    model = tiny_causal_lm("llama", tokenizer=tok, num_hidden_layers=num_hidden_layers)
    model.generation_config.eos_token_id = None
    model.eval()
    return model, tok


# -- DeepSpeed ----------------------------------------------------------------------------------------

def ds_config(stage: int, *, optimizer: bool = True, micro_batch: int = 2, **zero) -> dict:
    """A DeepSpeed config for tiny models on CPU. ZeRO-3 sets stage3_param_persistence_threshold=0:
    with the default (1e5 elements) every parameter of a tiny model is persistent, nothing is
    partitioned, and nothing can hang."""
    zero_cfg = {"stage": stage}
    if stage == 3:
        zero_cfg["stage3_param_persistence_threshold"] = 0
    zero_cfg.update(zero)
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": zero_cfg,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}
    return cfg


def deepspeed_engine(model, config, stack: contextlib.ExitStack):
    """deepspeed.initialize on the plugin's process group (DeepSpeed sees torch.distributed
    initialized and wraps it); the engine is destroyed when ``stack`` closes."""
    deepspeed.init_distributed(dist_backend="gloo")
    params = list(model.parameters()) if "optimizer" in config else None
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    stack.callback(destroy_engine, engine)
    return engine


def destroy_engine(engine) -> None:
    try:
        engine.destroy()
    except Exception:
        pass


@contextlib.contextmanager
def clean_state():
    """Ranks are reused by later tests: drop DeepSpeed engines, transformers' global DeepSpeed
    config (``is_deepspeed_zero3_enabled``) and accelerate's singletons on the way out."""
    with contextlib.ExitStack() as stack:
        try:
            yield stack
        finally:
            stack.close()
            reset_hf_state()
            gc.collect()


def reset_hf_state() -> None:
    try:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
    except Exception:
        pass
    try:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    except Exception:
        pass
    os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)


# -- FSDP2 ----------------------------------------------------------------------------------------------

def cpu_mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),))


def fsdp2_shard(model: nn.Module, children, reshard_after_forward: bool) -> nn.Module:
    """fully_shard each of ``children`` (a unit each: one all-gather per forward), then the root.
    reshard_after_forward=True is the ZeRO-3 analogue, False the ZeRO-2 one."""
    mesh = cpu_mesh()
    for child in children:
        fully_shard(child, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model
