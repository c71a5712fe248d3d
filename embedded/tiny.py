"""The embedded tiny model: a 2-layer Qwen3-architecture model with a byte-level BPE tokenizer trained locally
on agent-prompt text, so the CPU preset needs no download.

`build(path)` trains the tokenizer and initialises the model, saved in Hugging Face format (atomically);
`model_dir()` returns where it lives under `$SMRC_CACHE` (default `~/.cache/smrc`), building it on first use,
once across processes (`build_once`, which warmstart.py's recipes use too). From then on it is loaded through
exactly the same `from_pretrained` path as a real model (`models.load_model`), so the CPU preset exercises the
real loading, chat-template, checkpoint and generation code. `warmstart.py` turns it into `tiny-agent`.
"""

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from environments.alfworld_games import CAN_CONTAIN

TINY_VERSION = "v2"  # bump when the tiny recipe changes, so stale caches are not reused
_RECEPTACLES = {r.lower() for r in CAN_CONTAIN}
GOAL_TEMPLATES = ("put a {o} in {r}.", "put some {o} on {r}.", "look at {o} under the desklamp.",
                  "examine the {o} with the desklamp.", "clean some {o} and put it in {r}.",
                  "put a clean {o} in {r}.", "heat some {o} and put it in {r}.", "put a hot {o} in {r}.",
                  "cool some {o} and put it in {r}.", "put a cool {o} in {r}.", "put two {o} in {r}.",
                  "find two {o} and put them in {r}.")  # ALFWorld's goal sentences
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen-style chat template: the same shape real Qwen models use,
# without the system/tool branches we never send.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cache_dir() -> Path:
    return Path(os.environ.get("SMRC_CACHE", Path.home() / ".cache" / "smrc"))


def _tokenizer_corpus() -> list[str]:
    """Deterministic text the tiny BPE is trained on: the words agent prompts are made of
    (both environments)."""
    rooms = ("cabinet countertop drawer fridge microwave sinkbasin stoveburner coffeemachine toaster shelf "
             "desk dresser bed sidetable diningtable sofa armchair garbagecan safe bathtubbasin toilet "
             "towelholder handtowelholder countertop cart laundryhamper tvstand coffeetable ottoman desklamp "
             "floorlamp").split()
    objects = ("apple mug bowl plate cup pan pot egg potato tomato lettuce bread knife fork spoon spatula "
               "ladle kettle book pen pencil cellphone alarmclock laptop keychain creditcard cd pillow cloth "
               "soapbar soapbottle spraybottle candle toiletpaper towel vase statue box newspaper "
               "remotecontrol watch").split()
    verbs = ["go to", "open", "close", "take", "from", "move", "to", "put", "in/on", "heat", "cool", "clean",
             "with", "use", "examine", "look", "inventory", "search", "click", "back to search", "next >",
             "< prev", "buy now", "description", "features", "reviews", "price lower than", "dollars", "size",
             "color"]
    lines = [
        "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a clean "
        "mug in coffeemachine. Prior to this step, you have already taken 3 step(s). Below are the most "
        "recent 2 observations and the corresponding actions you took: [Observation 1: 'You arrive at "
        "cabinet 1. The cabinet 1 is closed.', Action 1: 'open cabinet 1'] You are now at step 4 and your "
        "current observation is: You open the cabinet 1. The cabinet 1 is open. In it, you see a mug 2, and "
        "a bowl 1. Your admissible actions of the current situation are: ['go to fridge 1', 'take mug 2 from "
        "cabinet 1']. Now it's your turn to take an action. You should first reason step-by-step about the "
        "current situation. This reasoning process MUST be enclosed within <think> </think> tags. Once "
        "you've finished your reasoning, you should choose an admissible action for current step and present "
        "it within <action> </action> tags.",
        "You are an expert autonomous agent operating in the WebShop e-commerce environment. Your task is "
        "to: i need a pair of lightweight men's running shoes with color: navy blue, and size: 10, and price "
        "lower than 50.00 dollars. Search [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > "
        "[SEP] B000TEST01 [SEP] Price: $39.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] "
        "Reviews [SEP] Buy Now",
        "Successful trajectory for this task. Current state: you are at the countertop 1, you hold nothing, "
        "open: fridge 1. Goal conditions already met: none. Candidate next action from the reference: take "
        "apple 1 from countertop 1. Nothing happens. You are carrying: a mug 2. You are not carrying "
        "anything. You pick up the You heat the You cool the You clean the using the You turn on the You "
        "move the You put the On the you see",
    ]
    # every object and receptacle type of the generated games, so each name is one token: a model this small
    # copies the goal's object into "take X from Y" far more easily when X is one token than when it is five
    names = sorted({n.lower() for r, objs in CAN_CONTAIN.items() for n in (r, *objs)})
    rooms, objects = (rooms + [n for n in names if n in _RECEPTACLES],
                      objects + [n for n in names if n not in _RECEPTACLES])
    lines += [goal.format(o=o, r=r) for goal in GOAL_TEMPLATES for o, r in zip(objects, rooms * 3)]
    for w in rooms + objects:
        lines += [f"go to {w} {i}" for i in range(1, 6)] + [f"a {w} {i}" for i in range(1, 6)]
    lines += [f"{v} {o} {i}" for v in verbs for o in objects[:8] for i in (1, 2)]
    lines += [" ".join(str(i) for i in range(100)), "0123456789 .,:;!?'\"()[]{}<>/-_=+*&%$#@"]
    return lines


def build(path: Path, seed: int = 0) -> None:
    """Train the tiny tokenizer and initialise the tiny Qwen3 model, saved in HF format at `path`
    (atomically)."""
    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_tokenizer_corpus() * 4, trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     bos_token=None, unk_token=None)
    hf_tok.chat_template = CHAT_TEMPLATE
    model = new_model(hf_tok, layers=2, hidden=128, seed=seed)
    save_atomically(model, hf_tok, path)


def new_model(tokenizer, layers: int, hidden: int, seed: int = 0):
    """A randomly initialised Qwen3-architecture model for `tokenizer` (heads of 64: vLLM's CPU attention
    rejects smaller ones; one key/value head; MLP width 2 × hidden; tied embeddings)."""
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=1,
                      head_dim=64, max_position_embeddings=8192, tie_word_embeddings=True,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_atomically(model, tokenizer, path: Path, extra: dict[str, str] | None = None) -> None:
    """save_pretrained (plus `extra` text files) into a temporary folder, then rename: concurrent builders
    never see a half-written model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + ".tmp"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for name, text in (extra or {}).items():
        (tmp / name).write_text(text)
    if not (tmp / "config.json").exists():  # e.g. a non-zero torchrun rank: transformers saves on rank 0 only
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"building {path.name}: save_pretrained wrote no model files (build it on rank 0)")
    try:
        os.replace(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race; its copy is identical


def model_dir() -> str:
    """The tiny model's directory (what `from_pretrained` takes), built on first use."""
    where = cache_dir() / f"tiny-qwen3-{TINY_VERSION}"
    build_once(where, build)
    return str(where)


def build_once(path: Path, build_fn: Callable[[Path], None]) -> None:
    """Build a cache entry unless it exists, under an exclusive lock beside it (`.NAME.lock`, released when
    the file closes): a second builder at the same time (a test worker, a sweep child) waits, then finds the
    build."""
    if (path / "config.json").exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "config.json").exists():
            build_fn(path)
