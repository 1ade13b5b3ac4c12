"""A Tinker training client's model: a base causal LM with LoRA adapters (or all of it trainable), its gradients
and its Adam state.

Shapes: N datums, L positions (right-padded); a datum is ``tokens`` [L] (the model's input) and its
``loss_fn_inputs`` [L] each (``target_tokens``: the token each position predicts).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlvr import core
from rlvr.loop.optim import optimizer_update
from rlvr.modeling import add_lora, load_model_and_tokenizer
from rlvr.policies.hf_model import disable_dropout
from rlvr.tinker.losses import datum_loss, loss_config

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj", "c_attn", "c_proj")  # llama-style and gpt2 names
MLP = ("gate_proj", "up_proj", "down_proj", "c_fc", "mlp.c_proj")
UNEMBED = ("lm_head",)
LORA_ALPHA = 32  # Tinker's: the adapters' scale is alpha / rank
TOKENS_PER_PASS = 8192  # datums are run through the model in passes of at most this many positions,
LOGITS_PER_PASS = 256 << 20  # and of at most this many bytes of float32 logits (a pass holds a few such tensors)


class ModelError(ValueError):
    """A model request that cannot run: a bad datum, rank or checkpoint."""


@dataclass(frozen=True)
class Adapters:
    """Which weights train: LoRA of ``rank`` on the chosen layers; rank 0: every weight (full fine-tuning)."""

    rank: int = 32
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ModelError(f"lora rank must be an integer >= 0 (0: full fine-tuning), got {self.rank!r}")
        if self.rank and not (self.train_mlp or self.train_attn or self.train_unembed):
            raise ModelError("LoRA with train_mlp, train_attn and train_unembed all false trains nothing")

    def target_modules(self, module: torch.nn.Module) -> list[str]:
        """The names of ``module``'s linear layers that get adapters."""
        wanted = (ATTN if self.train_attn else ()) + (MLP if self.train_mlp else ()) + \
            (UNEMBED if self.train_unembed else ())
        names = []
        for name, sub in module.named_modules():
            if not isinstance(sub, torch.nn.Linear):
                continue
            if any(name == w or name.endswith("." + w) for w in wanted):
                names.append(name)
        return names


def build_model(folder: str, adapters: Adapters, seed: int, device: str = "cpu") -> tuple[torch.nn.Module, object]:
    """The base model in ``folder`` with ``adapters`` (seeded), in train mode without dropout, and its tokenizer."""
    model, tokenizer = load_model_and_tokenizer(folder, device=device)
    disable_dropout(model)
    if adapters.rank:
        targets = adapters.target_modules(model)
        if not targets:
            raise ModelError(f"the model in {folder} has none of the layers LoRA should adapt")
        layers = dict(model.named_modules())
        smallest = min(min(layers[t].in_features, layers[t].out_features) for t in targets)
        if adapters.rank > smallest:
            raise ModelError(f"lora rank {adapters.rank} is more than the {smallest} features of the model's "
                             f"smallest adapted layer (a rank of at most {smallest} fits)")
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # LoRA on a tied unembedding (train_unembed) trains the adapter on the output layer alone, as meant
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
            torch.manual_seed(seed)
            model = add_lora(model, {"r": adapters.rank, "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0,
                                     "target_modules": targets})
    return model, tokenizer


@dataclass
class Datum:
    tokens: torch.Tensor  # [L] long
    inputs: dict[str, torch.Tensor]  # name -> [L]


def batch(datums: Sequence[Datum], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """tokens [N, L], mask [N, L] bool and each input [N, L], right-padded with 0."""
    width = max(len(d.tokens) for d in datums)
    tokens = torch.zeros(len(datums), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(datums), width, dtype=torch.bool, device=device)
    keys = set.intersection(*(set(d.inputs) for d in datums))
    inputs = {k: torch.zeros(len(datums), width, dtype=datums[0].inputs[k].dtype, device=device) for k in keys}
    for i, d in enumerate(datums):
        n = len(d.tokens)
        tokens[i, :n], mask[i, :n] = d.tokens, True
        for k in keys:
            inputs[k][i, :n] = d.inputs[k]
    return tokens, mask, inputs


def passes(datums: Sequence[Datum], tokens_per_pass: int = TOKENS_PER_PASS) -> list[list[int]]:
    """The datums' indices in groups of about ``tokens_per_pass`` padded positions each (at least one datum)."""
    groups: list[list[int]] = [[]]
    width = 0
    for i, d in enumerate(datums):
        new_width = max(width, len(d.tokens))
        if groups[-1] and new_width * (len(groups[-1]) + 1) > tokens_per_pass:
            groups.append([])
            new_width = len(d.tokens)
        groups[-1].append(i)
        width = new_width
    return groups


def check_datums(datums: Sequence[Datum], vocab_size: int, max_positions: int | None) -> None:
    """ModelError naming the first datum whose shapes or token ids cannot be run."""
    if not datums:
        raise ModelError("no datums: forward and forward_backward need at least one")
    for i, d in enumerate(datums):
        n = len(d.tokens)
        if n == 0:
            raise ModelError(f"datum {i}: empty model_input")
        if max_positions is not None and n > max_positions:
            raise ModelError(f"datum {i}: {n} tokens, more than the model's {max_positions} positions")
        if "target_tokens" not in d.inputs:
            raise ModelError(f"datum {i}: loss_fn_inputs has no target_tokens")
        for key, value in d.inputs.items():
            if tuple(value.shape) != (n,):
                raise ModelError(f"datum {i}: loss_fn_inputs[{key!r}] has shape {list(value.shape)}, the "
                                 f"model_input has {n} tokens (only one value per position is supported)")
        for key in ("target_tokens",):
            ids = d.inputs[key]
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                raise ModelError(f"datum {i}: {key} has ids outside the vocabulary [0, {vocab_size})")
        if int(d.tokens.min()) < 0 or int(d.tokens.max()) >= vocab_size:
            raise ModelError(f"datum {i}: model_input has ids outside the vocabulary [0, {vocab_size})")


@dataclass(frozen=True)
class AdamStep:
    """The SDK's ``AdamParams``: decoupled weight decay (AdamW), gradient clipping by global norm (0: none)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


class TrainingModel:
    """One training client's model: ``forward`` (optionally backward, adding into the gradients), ``optim_step``,
    ``save`` and ``load``."""

    def __init__(self, base: str, folder: str, adapters: Adapters, seed: int = 0, device: str = "cpu"):
        self.base, self.folder, self.adapters, self.seed = base, folder, adapters, seed
        self.module, self.tokenizer = build_model(folder, adapters, seed, device)
        self.device = next(self.module.parameters()).device
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=AdamStep.learning_rate, fused=True)
        self.steps = 0
        config = getattr(self.module, "config", None)
        self.vocab_size = self.module.get_output_embeddings().weight.shape[0]
        self.max_positions = getattr(config, "max_position_embeddings", None)
        # a 49k vocabulary's logits, log-softmax and their gradients: ~1 GiB a pass at 1365 positions
        self.tokens_per_pass = max(64, min(TOKENS_PER_PASS, LOGITS_PER_PASS // (4 * self.vocab_size)))

    # ---- forward and backward -----------------------------------------------------------

    def forward(self, datums: Sequence[Datum], loss_fn: str, config: Mapping | None, backward: bool
                ) -> tuple[list[torch.Tensor], dict[str, float]]:
        """Each datum's log-probs of its ``target_tokens`` [L_i] and the metrics (``loss:sum``); with ``backward``
        the loss's gradient is added to the parameters' ``.grad``."""
        check_datums(datums, self.vocab_size, self.max_positions)
        settings = loss_config(loss_fn, config)
        out: list[torch.Tensor] = [torch.empty(0)] * len(datums)
        total = 0.0
        for group in passes(datums, self.tokens_per_pass):
            tokens, mask, inputs = batch([datums[i] for i in group], self.device)
            with torch.set_grad_enabled(backward):
                logits = self.module(input_ids=tokens, attention_mask=mask.long()).logits  # [n, L, V]
                log_probs = core.token_log_probs(logits, inputs["target_tokens"], 1.0)  # [n, L]
                loss = datum_loss(loss_fn, log_probs, inputs, mask, settings).sum()
            if backward:
                loss.backward()
            total += float(loss.detach())
            for row, i in enumerate(group):
                out[i] = log_probs[row, : len(datums[i].tokens)].detach().cpu()
        return out, {"loss:sum": total}

    # ---- the optimizer ------------------------------------------------------------------

    def optim_step(self, step: AdamStep) -> dict[str, float]:
        """One AdamW step with ``step``'s settings on the gradients added since the last one, then clears them."""
        grads = [p.grad for p in self.params if p.grad is not None]
        limit = step.grad_clip_norm if step.grad_clip_norm > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, limit)) if grads else 0.0
        group = self.optimizer.param_groups[0]
        group.update(lr=step.learning_rate, betas=(step.beta1, step.beta2), eps=step.eps,
                     weight_decay=step.weight_decay)
        if grads:
            optimizer_update(self.optimizer)
        for p in self.params:
            p.grad = None
        self.steps += 1
        return {"grad_norm:mean": norm}

    # ---- weights on disk ----------------------------------------------------------------

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The weights that train (the adapters, or all), detached copies on the CPU."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        return {names[id(p)]: p.detach().to("cpu", copy=True) for p in self.params}

    def save(self, folder: Path, with_optimizer: bool) -> None:
        """The trainable weights (and the Adam state) in ``folder``, with what rebuilds the model."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.trainable_state(), str(folder / "weights.safetensors"))
        meta = {"base": self.base, "adapters": asdict(self.adapters), "seed": self.seed, "steps": self.steps}
        (folder / "model.json").write_text(json.dumps(meta))
        if with_optimizer:
            torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

    def load(self, folder: Path, with_optimizer: bool) -> None:
        """The weights (and Adam state) ``save`` wrote; ModelError when they are another model's."""
        from safetensors.torch import load_file

        meta = read_meta(folder)
        if meta["base"] != self.base or Adapters(**meta["adapters"]) != self.adapters:
            raise ModelError(f"checkpoint {folder.name} is of {meta['base']} with {meta['adapters']}, this model is "
                             f"{self.base} with {asdict(self.adapters)}")
        state = load_file(str(folder / "weights.safetensors"))
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)
        if with_optimizer:
            if not (folder / "optimizer.pt").is_file():
                raise ModelError(f"checkpoint {folder.name} has no optimizer state (saved for sampling only?)")
            self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        self.steps = int(meta.get("steps", 0))


def read_meta(folder: Path) -> dict:
    """A checkpoint's ``model.json``; ModelError naming the folder when it is missing or unreadable."""
    try:
        meta = json.loads((folder / "model.json").read_text())
        Adapters(**meta["adapters"])
        str(meta["base"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelError(f"checkpoint {folder} is damaged or not a checkpoint ({type(err).__name__}: {err})") \
            from None
    return meta
