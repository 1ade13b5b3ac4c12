"""tinker-cookbook's supervised loop (``tinker_cookbook.supervised.train.main``, unchanged) on a local JSONL file of
conversations, against any Tinker server (``TINKER_BASE_URL``), e.g. ``rlvr tinker``:

    python examples/tinker/sl_local.py model_name=HuggingFaceTB/SmolLM2-135M-Instruct log_path=/tmp/sl

sl_basic's config, but for what needs the network or a model the cookbook knows: the data is a local file (default:
arithmetic_conversations.jsonl beside this file, 16 questions of examples/data/chat_arithmetic_train.jsonl answered
with the number alone) and the renderer is named (qwen3_instruct, ChatML, as SmolLM2's chat template is). With
``batch_size`` the file's length an epoch is one step over all of it, so ``train_mean_nll`` in
``log_path``/metrics.jsonl is comparable from step to step.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import chz
from tinker_cookbook import cli_utils
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

DATA = Path(__file__).parent / "arithmetic_conversations.jsonl"


@chz.chz
class CLIConfig:
    model_name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    renderer_name: str = "qwen3_instruct"
    file_path: str = str(DATA)
    max_length: int = 2048
    batch_size: int = 16
    num_epochs: int = 3  # with one batch per epoch, one step each
    max_steps: int | None = None
    learning_rate: float = 2e-4
    lora_rank: int = 32
    base_url: str | None = None  # None: the SDK reads $TINKER_BASE_URL
    log_path: str = "/tmp/tinker-examples/sl_local"
    behavior_if_log_dir_exists: cli_utils.LogdirBehavior = "delete"


def build_config(cli: CLIConfig) -> train.Config:
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=cli.model_name, renderer_name=cli.renderer_name,
                                            max_length=cli.max_length, batch_size=cli.batch_size,
                                            train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    return train.Config(log_path=cli.log_path, model_name=cli.model_name, recipe_name="recipe_sl_local",
                        renderer_name=cli.renderer_name,
                        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=cli.file_path),
                        learning_rate=cli.learning_rate, lr_schedule="linear", num_epochs=cli.num_epochs,
                        max_steps=cli.max_steps, lora_rank=cli.lora_rank, base_url=cli.base_url, eval_every=0,
                        save_every=0)


def main(cli: CLIConfig) -> None:
    config = build_config(cli)
    cli_utils.check_log_dir(config.log_path, behavior_if_exists=cli.behavior_if_log_dir_exists)
    asyncio.run(train.main(config))


if __name__ == "__main__":
    main(chz.entrypoint(CLIConfig))
