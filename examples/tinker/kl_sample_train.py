"""tinker-cookbook's RL numerics check in small: ``kl_sample_train`` between a Tinker server's sampler and its trainer,
for the same tokens, as the cookbook's RL loop logs it each step (``optim/kl_sample_train_v1``, ``_v2``):

    python examples/tinker/kl_sample_train.py model_name=HuggingFaceTB/SmolLM2-135M-Instruct

Each step samples ``group_size`` completions of each prompt (the user turns of arithmetic_conversations.jsonl) from
the training client's current weights, makes the RL loop's datums of them with the cookbook's own
``assemble_training_data``, recomputes their log-probs with ``forward`` (importance_sampling, as the loop's
forward_backward does), and prints ``rl.metrics.compute_kl_sample_train`` of the two, with the largest difference.
Then one Adam step on the completions' cross-entropy, so that later steps sample with a trained adapter (a new LoRA
adapter adds nothing).

The cookbook's own check, ``tinker_cookbook.recipes.rl_numerics_check``, does not run offline: its documents are pages
of WikiText-103, loaded from the Hugging Face hub, and by default 62-80K tokens read over about 30 turns, past
SmolLM2's 8192 positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import chz
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
from tinker_cookbook.rl.metrics import compute_kl_sample_train
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition
from tinker_cookbook.tokenizer_utils import get_tokenizer

PROMPTS = Path(__file__).parent / "arithmetic_conversations.jsonl"


@chz.chz
class CLIConfig:
    model_name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    renderer_name: str = "qwen3_instruct"
    file_path: str = str(PROMPTS)
    num_prompts: int = 4
    group_size: int = 4
    max_tokens: int = 64
    temperature: float = 1.0
    steps: int = 3
    learning_rate: float = 1e-4
    lora_rank: int = 32
    base_url: str | None = None  # None: the SDK reads $TINKER_BASE_URL


def sampled_group(prompt: tinker.ModelInput, response: tinker.SampleResponse) -> TrajectoryGroup:
    """One prompt's completions as the RL loop holds them: one-transition trajectories (rewards 0: advantages do not
    enter the check)."""
    trajectories = [Trajectory(transitions=[Transition(ob=prompt, reward=0.0, episode_done=True,
                                                       ac=TokensWithLogprobs(s.tokens, s.logprobs, s.stop_reason))],
                               final_ob=tinker.ModelInput.empty())
                    for s in response.sequences]
    return TrajectoryGroup(trajectories, [0.0] * len(trajectories), [{} for _ in trajectories])


def main(cli: CLIConfig) -> list[dict[str, float]]:
    tokenizer = get_tokenizer(cli.model_name)
    renderer = renderers.get_renderer(cli.renderer_name, tokenizer)
    with open(cli.file_path) as f:
        conversations = [json.loads(line)["messages"] for line in f][:cli.num_prompts]
    prompts = [renderer.build_generation_prompt([m for m in messages if m["role"] != "assistant"])
               for messages in conversations]
    params = tinker.SamplingParams(max_tokens=cli.max_tokens, temperature=cli.temperature,
                                   stop=renderer.get_stop_sequences())
    service = tinker.ServiceClient(base_url=cli.base_url)
    training = service.create_lora_training_client(base_model=cli.model_name, rank=cli.lora_rank)
    results = []
    for step in range(cli.steps):
        sampler = training.save_weights_and_get_sampling_client()
        futures = [sampler.sample(prompt, num_samples=cli.group_size, sampling_params=params) for prompt in prompts]
        groups = [sampled_group(prompt, future.result()) for prompt, future in zip(prompts, futures)]
        data, _ = assemble_training_data(groups, compute_advantages(groups))
        # the RL loop sends its datums without the mask, which only its metrics read
        sent = [tinker.Datum(model_input=d.model_input,
                             loss_fn_inputs={k: v for k, v in d.loss_fn_inputs.items() if k != "mask"}) for d in data]
        out = training.forward(sent, loss_fn="importance_sampling").result()
        trained = [o["logprobs"].to_torch() for o in out.loss_fn_outputs]
        metrics = compute_kl_sample_train(data, trained)
        masks = [d.loss_fn_inputs["mask"].to_torch() > 0 for d in data]
        sampled = [d.loss_fn_inputs["logprobs"].to_torch() for d in data]
        metrics["max_abs_diff"] = max(float((s - t)[m].abs().max()) for s, t, m in zip(sampled, trained, masks)
                                      if m.any())
        metrics["sampled_tokens"] = sum(int(m.sum()) for m in masks)
        print(f"step {step}: " + "  ".join(f"{k}={v:.3g}" for k, v in metrics.items()), flush=True)
        results.append(metrics)
        if step + 1 < cli.steps:
            sft = [tinker.Datum(model_input=d.model_input,
                                loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"],
                                                "weights": d.loss_fn_inputs["mask"]}) for d in data]
            backward = training.forward_backward(sft, loss_fn="cross_entropy")
            training.optim_step(tinker.AdamParams(learning_rate=cli.learning_rate)).result()
            backward.result()
    return results


if __name__ == "__main__":
    main(chz.entrypoint(CLIConfig))
