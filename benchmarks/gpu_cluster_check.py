"""GPU check of the cluster parts: rlvr's learner over NCCL, a sharded checkpoint, and the
vLLM engine inside a Ray rollout worker, each reported as passed, failed or skipped (with why).

1. **Learners over NCCL.** One process per GPU (all of them; one GPU is a group of one), each
   rlvr's ``LearnerRank`` (``rlvr.cluster.learner_rank``, as a Ray learner runs it) with
   ``learner_strategy=fsdp`` on its GPU: a random tiny Llama, one optimizer step on its share
   of a batch of random tokens, the gradients reduced over NCCL. Reported: each
   rank's parameter + Adam bytes, the step's loss, and whether the ranks' weights agree.
2. **A sharded checkpoint.** Each rank saves its shards of the weights and Adam state with
   ``torch.distributed.checkpoint`` and loads them into a freshly built learner: reported
   whether every weight came back equal.
3. **vLLM inside a rollout worker.** ``rlvr train`` with ``cluster.rollout_workers=1`` and
   ``policy.options.engine=vllm`` for two epochs: needs ``ray`` and ``vllm``, skipped (and
   said so) where either is missing.

``--smoke`` runs 1-2 on the CPU with 2 gloo processes and skips 3 (the test suite runs it).

    python benchmarks/gpu_cluster_check.py --out gpu_cluster_check     # on the GPU machine
    python benchmarks/gpu_cluster_check.py --smoke --out /tmp/cluster_smoke
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent))
from learner_memory import held_bytes  # noqa: E402
from rlvr.cluster.weight_sync import free_port  # noqa: E402
from rlvr.modeling import init_model, quiet_libraries  # noqa: E402


def batch(policy: object) -> object:
    """8 responses of 6 random tokens to 4 prompts of 4 (a learner trains on batches the
    rollout workers sampled: it never samples itself)."""
    from rlvr.batch.rollout import Samples

    generator = torch.Generator().manual_seed(0)
    vocab = policy.module.get_input_embeddings().weight.shape[0]
    device = next(policy.module.parameters()).device
    prompt_ids = torch.randint(3, vocab, (8, 4), generator=generator).to(device)
    response_ids = torch.randint(3, vocab, (8, 6), generator=generator).to(device)
    ones = torch.ones_like(response_ids, dtype=torch.bool)
    return Samples(None, response_ids, ones, prompt_ids, torch.ones_like(prompt_ids, dtype=torch.bool))


def learner_rank(rank: int, world_size: int, port: int, model: str, device: str, folder: str, out: dict) -> None:
    """One learner: a step on its share, then a sharded save and a load into a fresh learner."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from rlvr.batch.rollout import Rollout
    from rlvr.cluster.learner_rank import LearnerRank
    from rlvr.config import load_config
    from rlvr.core import aggregation_weights

    where = f"cuda:{rank}" if device == "cuda" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank)
    overrides = ["policy.name=causal_lm", f"policy.options={{model: '{model}', device: '{where}', max_new_tokens: 6}}",
                 "task.name=sort_text", "cluster.learner_strategy=fsdp", "algo.loss=naive", "algo.group_size=2",
                 "threads=1"]
    result: dict = {}
    try:
        with quiet_libraries():
            config = load_config(None, overrides)
            learner = LearnerRank(config, rank, world_size, f"tcp://127.0.0.1:{port}")
        policy = learner.st.policy
        samples = batch(policy)  # the same batch on every rank
        deltas = torch.linspace(-1, 1, samples.num_responses, device=samples.response_ids.device)
        weights = aggregation_weights(samples.policy_mask, "token_mean", policy.max_response_length)
        record = learner.step(Rollout(samples, deltas, None, None, weights, {}), epoch=0)
        parameter_bytes, adam_bytes = held_bytes(learner)
        result.update(loss=record["loss"], grad_norm=record["grad_norm"], parameter_bytes=parameter_bytes,
                      adam_bytes=adam_bytes)
        full = {k: v.cpu() for k, v in learner.state_dict().items()}  # gathered whole (a collective)
        model_state, optim_state = get_state_dict(policy.module, learner.st.optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder)
        with torch.no_grad():  # scramble the weights, then load the checkpoint back into them
            for p in policy.module.parameters():
                (p.to_local() if hasattr(p, "to_local") else p).zero_()
        model_state, optim_state = get_state_dict(policy.module, learner.st.optimizer)
        loaded = {"model": model_state, "optim": optim_state}
        dcp.load(loaded, checkpoint_id=folder)
        set_state_dict(policy.module, learner.st.optimizer, model_state_dict=loaded["model"],
                       optim_state_dict=loaded["optim"])
        back = {k: v.cpu() for k, v in learner.state_dict().items()}
        result["checkpoint_round_trip"] = all(torch.equal(full[k], back[k]) for k in full)
        result["weights_sum"] = float(sum(v.double().sum() for v in full.values()))
        learner.close()
    except Exception:  # noqa: BLE001 - reported, not raised: the check goes on to its next part
        result["error"] = traceback.format_exc(limit=6)
    out[rank] = result


def check_learners(model: Path, device: str, world_size: int) -> dict:
    port = free_port()
    out = mp.Manager().dict()
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(learner_rank, args=(world_size, port, str(model), device, folder, out), nprocs=world_size,
                 join=True)
    ranks = [dict(out[r]) for r in range(world_size)]
    errors = [r.get("error") for r in ranks if r.get("error")]
    agree = len({round(r.get("weights_sum", 0.0), 6) for r in ranks}) == 1
    return {"status": "failed" if errors or not agree else "passed", "world_size": world_size,
            "backend": "nccl" if device == "cuda" else "gloo", "ranks": ranks, "ranks_agree": agree,
            "checkpoint_round_trip": all(r.get("checkpoint_round_trip") for r in ranks), "errors": errors}


def check_vllm_worker(model: Path) -> dict:
    missing = [m for m in ("ray", "vllm") if importlib.util.find_spec(m) is None]
    if missing:
        return {"status": "skipped", "why": f"needs {' and '.join(missing)}, not installed here"}
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", "task.name=sort_text",
                               "task.options={num_digits: 3}", "task.prompts_per_epoch=2", "policy.name=causal_lm",
                               f"policy.options={{model: '{model}', engine: vllm, max_new_tokens: 6}}",
                               "algo.epochs=2", "algo.group_size=2", "cluster.rollout_workers=1",
                               "log.progress=false", "log.plot=false", f"out_dir={out}"],
                              capture_output=True, text=True, timeout=600)
    return {"status": "passed" if done.returncode == 0 else "failed", "returncode": done.returncode,
            "stderr_tail": done.stderr[-1500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, 2 gloo learners, no vLLM part")
    parser.add_argument("--out", default="gpu_cluster_check", help="results: OUT.json")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    world_size = max(torch.cuda.device_count(), 1) if device == "cuda" else 2
    results: dict = {"torch": torch.__version__, "device": device}
    with tempfile.TemporaryDirectory() as tmp, quiet_libraries():
        model = init_model(Path(tmp) / "model", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                           seed=0, max_positions=64)
        results["learners_and_sharded_checkpoint"] = check_learners(model, device, world_size)
        results["vllm_rollout_worker"] = ({"status": "skipped", "why": "--smoke"} if args.smoke
                                          else check_vllm_worker(model))
    Path(f"{args.out}.json").write_text(json.dumps(results, indent=2))
    learners = results["learners_and_sharded_checkpoint"]
    print(f"learners ({learners['backend']}, {learners['world_size']} rank(s), fsdp): {learners['status']}; "
          f"ranks agree {learners['ranks_agree']}; sharded checkpoint round trip {learners['checkpoint_round_trip']}")
    for rank, r in enumerate(learners["ranks"]):
        if "error" in r:
            print(f"  rank {rank} error:\n{r['error']}")
        else:
            print(f"  rank {rank}: loss {r['loss']:.4f}, parameters {r['parameter_bytes'] / 2**20:.2f} MiB, "
                  f"Adam {r['adam_bytes'] / 2**20:.2f} MiB")
    vllm = results["vllm_rollout_worker"]
    print(f"vllm in a rollout worker: {vllm['status']}" + (f" ({vllm['why']})" if "why" in vllm else ""))


if __name__ == "__main__":
    main()
