"""A tiny real tokenizer directory for the benchmark client (the simulated model has no weights to ship one).

    python -m sglang_sim.tokenizer DIR     # writes DIR/tokenizer.json + DIR/tokenizer_config.json

A WordLevel tokenizer built with the `tokenizers` library (installed with the benchmark's dependencies, not a
dependency of the sim itself); `transformers.AutoTokenizer.from_pretrained(DIR)` loads it offline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sglang_sim.server import WORDS

SPECIAL = ("[UNK]", "[BOS]", "[EOS]")
VOCAB_SIZE = 4096  # the benchmark's random-ids draws ids below the vocabulary size


def vocabulary() -> dict[str, int]:
    words = list(dict.fromkeys(word.lower() for word in WORDS))
    filler = [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIAL) - len(words))]
    return {token: index for index, token in enumerate((*SPECIAL, *words, *filler))}


def write(directory: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocabulary(), unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "[BOS]",
              "eos_token": "[EOS]", "model_max_length": 1_000_000}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m sglang_sim.tokenizer DIR")
    print(write(Path(sys.argv[1])))
