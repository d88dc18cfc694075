"""`h2 generate`: text from a trained run's newest checkpoint (h2.train.generation).

    h2 generate --run runs/tiny --prompt "def " --max-new-tokens 64                  # greedy
    h2 generate --run runs/tiny --prompt "def " --temperature 0.8 --top-k 40 --seed 1  # sampled

Prints the prompt followed by the generated text.
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    generate = sub.add_parser("generate", help="text from a trained run's newest checkpoint (greedy or sampled)")
    generate.add_argument("--run", required=True, metavar="DIR", help="the run's output folder (h2 train --out)")
    generate.add_argument("--prompt", required=True, help="the text to continue")
    generate.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens to generate (default 64)")
    generate.add_argument("--temperature", type=float, default=0.0,
                          help="0: greedy, the most likely token each time; above 0: sample (default 0)")
    generate.add_argument("--top-k", type=int, metavar="K",
                          help="sample only among the K most likely tokens (default: all)")
    generate.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    generate.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace) -> int:
    from h2.train.generation import Sampling, generate, load_run_model, run_tokenizer

    model, manifest = load_run_model(args.run)
    tokenizer = run_tokenizer(manifest)
    prompt_ids = [int(token) for token in tokenizer.encode(args.prompt)]
    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    print(args.prompt + tokenizer.decode(generate(model, prompt_ids, args.max_new_tokens, sampling)), flush=True)
    return 0
