"""``rlvr tinker``: serve the Tinker API for one or more base models until stopped (Ctrl-C or SIGTERM)."""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path

from rlvr.base.errors import ConfigError
from rlvr.base.extras import AGENT_MODULES, LM_MODULES, require

DEFAULT_MODEL = "smollm2-135m-instruct"
TINKER_MODULES = ("tinker", "zstandard", "peft", *LM_MODULES, *AGENT_MODULES)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", metavar="MODEL",
                   help=f"a base model to serve: a packaged name or its hub name, a folder, a GGUF file (repeat for "
                        f"several; default {DEFAULT_MODEL})")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="the port (0: any free one; default 8000)")
    p.add_argument("--api-key", help="the key clients must send, tml-... (default: a new random one, printed)")
    p.add_argument("--state-dir", default="tinker-state",
                   help="where training runs and checkpoints live, kept across restarts (default ./tinker-state)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda where there is one)")


def cmd_tinker(args: argparse.Namespace) -> int:
    require("rlvr tinker", TINKER_MODULES)
    import torch

    from rlvr.tinker.names import place_tokenizer, served_model
    from rlvr.tinker.server import listener, serve, url_of
    from rlvr.tinker.service import Service
    from rlvr.tinker.store import Store

    key = args.api_key or f"tml-{secrets.token_urlsafe(24)}"
    if not key.startswith("tml-"):
        raise ConfigError(f"--api-key must start with tml- (as the tinker SDK checks), got {key[:8]!r}...")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    models = [served_model(name) for name in (args.model or [DEFAULT_MODEL])]
    try:
        sock = listener(args.host, args.port)
    except OSError as err:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None
    for model in models:
        place_tokenizer(model)
    service = Service(models, Store(Path(args.state_dir)), device)
    names = ", ".join(" = ".join(dict.fromkeys(m.aliases)) for m in models)
    print(f"rlvr tinker: serving {names} on {device}\n"
          f"  export TINKER_BASE_URL={url_of(sock)}\n"
          f"  export TINKER_API_KEY={key}\n"
          f"  state: {Path(args.state_dir).resolve()}", flush=True)
    serve(service, sock, key)
    return 0
