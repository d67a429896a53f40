"""Tokenization, chat prompts and the deterministic text the simulated model "generates"."""

import hashlib
import random
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


class TextCodec:
    """The model's tokenizer.json when it has one; otherwise one token per UTF-8 byte."""

    def __init__(self, model_path: Path, tokenizer_config: dict):
        tokenizer_file = model_path / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file)) if tokenizer_file.exists() else None
        self.chat_template = tokenizer_config.get("chat_template")
        self.special_tokens = {k: v for k, v in tokenizer_config.items() if k in ("bos_token", "eos_token")}

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return list(text.encode())
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(ids).decode(errors="replace")
        return self.tokenizer.decode(ids)

    def generation_vocabulary(self) -> list[int]:
        """Token ids the simulated model emits: ordinary tokens only (no specials, no control bytes)."""
        if self.tokenizer is None:
            return list(range(ord("a"), ord("z") + 1)) + [ord(" ")]
        special = set(self.tokenizer.get_added_tokens_decoder())
        return [i for i in range(self.tokenizer.get_vocab_size()) if i not in special]

    def chat_prompt(self, messages: list[dict]) -> str:
        """The prompt a chat turns into: the model's chat template, or role-prefixed lines without one."""
        flat = [{**m, "content": message_text(m.get("content"))} for m in messages]
        if not self.chat_template:
            return "".join(f"{m['role']}: {m['content']}\n" for m in flat) + "assistant: "
        template = _jinja().from_string(self.chat_template)
        return template.render(messages=flat, add_generation_prompt=True, **self.special_tokens)


def _jinja() -> ImmutableSandboxedEnvironment:
    """The sandbox transformers renders chat templates in, with its raise_exception helper."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str):
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    return env


def message_text(content) -> str:
    """OpenAI message content is a string or a list of parts; only text parts count here."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def prompt_seed(prompt_ids: list[int]) -> int:
    return int.from_bytes(hashlib.sha256(repr(prompt_ids).encode()).digest()[:8], "big")


def generated_ids(prompt_ids: list[int], count: int, vocabulary: list[int], weights: bytes) -> list[int]:
    """The same prompt always yields the same tokens from the same weights (model.read_weights' digest)."""
    rng = random.Random(int.from_bytes(hashlib.sha256(weights + repr(prompt_ids).encode()).digest()[:8], "big"))
    return [rng.choice(vocabulary) for _ in range(count)]


def natural_length(prompt_ids: list[int], low: int = 16, span: int = 241) -> int:
    """Where the simulated model would emit EOS for this prompt (ignored with ignore_eos)."""
    return low + prompt_seed(prompt_ids) % span
