#!/usr/bin/env python3
"""Writes the chat-template golden files of tests/test_jinja.c with Hugging Face transformers.

For each template in tests/data/chat/*.jinja and each case of tests/data/chat/cases.json, the
prompt transformers' apply_chat_template(tokenize=False) renders goes to
tests/data/chat/golden/<template>.<case>.txt, or, when the template fails, its message to
<template>.<case>.err. Run from the repository root: python3 scripts/chat_template_golden.py
"""
import glob
import json
import os

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "chat")


def main():
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0, "<|im_end|>": 1}, unk_token="<unk>")),
                                  eos_token="<|im_end|>")
    cases = json.load(open(os.path.join(DATA, "cases.json"), encoding="utf-8"))
    out = os.path.join(DATA, "golden")
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "*")):
        os.remove(old)
    for path in sorted(glob.glob(os.path.join(DATA, "*.jinja"))):
        stem = os.path.basename(path)[: -len(".jinja")]
        template = open(path, encoding="utf-8").read()
        for name, case in cases.items():
            kwargs = dict(case.get("kwargs") or {})
            if case.get("enable_thinking") is not None:
                kwargs["enable_thinking"] = case["enable_thinking"]
            try:
                text, ext = tok.apply_chat_template(case["messages"], tools=case.get("tools"), chat_template=template,
                                                    tokenize=False, add_generation_prompt=case.get("add_generation_prompt", True),
                                                    **kwargs), "txt"
            except Exception as e:
                text, ext = str(e), "err"
            with open(os.path.join(out, f"{stem}.{name}.{ext}"), "w", encoding="utf-8", newline="") as f:
                f.write(text)


if __name__ == "__main__":
    main()
